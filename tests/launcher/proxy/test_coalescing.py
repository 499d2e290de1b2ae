"""The store proxy's coalescing rules, as values: what may share an upstream request, what each
caller of a merged ADD gets, which waiters an answer covers, and whom a dropped connection blames.

The proxy's contract: a client request is answered only from an upstream request sent after that
request arrived. The end-to-end checks are the differential and history tests (test_proxy_*.py);
these pin the rules themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from npu_job.launcher.protocol import Op, Request
from npu_job.launcher.proxy.coalescing import (
    AppliedMarks,
    Batch,
    Joins,
    WaitGroup,
    add_batch,
    add_results,
    dropped_for,
)


@dataclass(frozen=True)
class Client:
    id: int


def test_merged_adds_answer_each_caller_as_if_it_ran_alone_in_arrival_order():
    # the root held 10; deltas 1, 5, -2 went up as one ADD of 4 and it answered 14
    assert add_results(14, [1, 5, -2]) == [11, 16, 14]
    assert add_results(7, [7]) == [7]


def test_one_upstream_add_carries_every_waiting_delta_unless_their_sum_leaves_i64():
    assert add_batch([1, 2, 3]) == 3
    assert add_batch([(1 << 63) - 1, 1, 5]) == 1  # the sum would not fit the wire's i64
    assert add_batch([-(1 << 63), -1]) == 1
    assert add_batch([-(1 << 63), 1]) == 2


def test_a_read_shares_only_an_unsent_identical_read():
    joins: Joins[str] = Joins()
    joins.reading(Op.GET, (b"/k",), "reply-1")
    joins.reading(Op.CHECK, (b"/k", b"/j"), "check-1")
    assert joins.read(Op.GET, (b"/k",)) == "reply-1"
    assert joins.read(Op.CHECK, (b"/k", b"/j")) == "check-1"
    assert joins.read(Op.CHECK, (b"/j", b"/k")) is None  # another key list
    joins.sent()  # the batch went out: the root may answer it before a newcomer arrived
    assert joins.read(Op.GET, (b"/k",)) is None
    assert joins.read(Op.CHECK, (b"/k", b"/j")) is None


def test_a_local_write_ends_the_sharing_of_reads_of_its_keys():
    joins: Joins[str] = Joins()
    joins.reading(Op.GET, (b"/k",), "get-k")
    joins.reading(Op.GET, (b"/j",), "get-j")
    joins.reading(Op.CHECK, (b"/j", b"/k"), "check")
    joins.noted(Request(Op.SET, (b"/k",), (b"v",)))
    assert joins.read(Op.GET, (b"/k",)) is None  # the writer must read its write
    assert joins.read(Op.CHECK, (b"/j", b"/k")) is None
    assert joins.read(Op.GET, (b"/j",)) == "get-j"
    joins.answered(Op.GET, (b"/j",), "another reply")  # not the one shared: kept
    assert joins.read(Op.GET, (b"/j",)) == "get-j"
    joins.answered(Op.GET, (b"/j",), "get-j")
    assert joins.read(Op.GET, (b"/j",)) is None


def test_waits_share_a_group_until_a_delete_of_one_of_its_keys():
    joins: Joins[str] = Joins()
    group = joins.new_wait_group((b"/k", b"/j"))
    assert joins.wait_group((b"/k", b"/j")) is group
    joins.noted(Request(Op.SET, (b"/k",), (b"v",)))  # a set does not end waiting
    assert joins.wait_group((b"/k", b"/j")) is group
    joins.noted(Request(Op.DELETE_KEY, (b"/j",)))
    assert joins.wait_group((b"/k", b"/j")) is None
    assert not group.joinable
    follower = joins.new_wait_group(group.keys, follows=group)
    assert not follower.joinable and joins.wait_group(group.keys) is None


def test_waits_on_queue_keys_are_never_shared():
    joins: Joins[str] = Joins()
    joins.noted(Request(Op.QUEUE_PUSH, (b"/q",), (b"item",)))
    group = joins.new_wait_group((b"/q",))
    assert not group.joinable and joins.wait_group((b"/q",)) is None


def test_a_waiter_that_arrives_after_the_groups_request_went_out_is_asked_again():
    group: WaitGroup[Client] = WaitGroup((b"/k",))
    group.add(Client(1))  # nothing asked yet
    batch = Batch()
    group.asking(batch)
    group.add(Client(2))  # the request is still in the outgoing batch: covered
    batch.sent = True
    group.add(Client(3))  # arrived after it went out: late
    assert group.shared
    answered, again = group.finish(failed=False)
    assert sorted(answered) == [1, 2] and sorted(again) == [3]
    assert group.state == "done" and group.empty


def test_a_new_request_covers_the_late_waiters_and_a_failure_answers_everyone():
    group: WaitGroup[Client] = WaitGroup((b"/k",))
    sent = Batch()
    sent.sent = True
    group.asking(sent)
    group.add(Client(1))
    assert list(group.late) == [1]
    group.asking(Batch())  # e.g. its late waiters asked again
    assert list(group.waiters) == [1] and not group.late
    sent_again = Batch()
    sent_again.sent = True
    group.asking(sent_again)
    group.add(Client(2))
    group.remove(Client(1))
    answered, again = group.finish(failed=True)
    assert sorted(answered) == [2] and again == {}


def _pending(*entries: tuple[Op, bool]) -> list[tuple[Request, object]]:
    return [(Request(op, (b"/k",)), "reply" if has_reply else None) for op, has_reply in entries]


def test_the_root_dropped_the_connection_for_the_first_request_still_owed_a_reply():
    pending = _pending((Op.SET, False), (Op.GET, True), (Op.ADD, True), (Op.SET, False))
    assert dropped_for(pending) == 1  # a GET of a missing key (the classic server)
    assert dropped_for(_pending((Op.ADD, True), (Op.GET, True))) == 0
    assert dropped_for(_pending((Op.MULTI_GET, True))) == 0
    assert dropped_for(_pending((Op.QUEUE_LEN, True), (Op.GET, True))) == 0  # classic: no queues


def test_no_request_is_blamed_when_the_first_owed_one_cannot_fail_at_the_root():
    assert dropped_for(_pending((Op.CHECK, True), (Op.ADD, True))) is None
    assert dropped_for(_pending((Op.SET, False))) is None
    assert dropped_for([]) is None


def test_a_no_reply_write_is_applied_once_a_request_sent_after_it_is_answered():
    marks: AppliedMarks[str] = AppliedMarks()
    marks.asked += 1  # a GET in flight
    set_mark = marks.mark()  # then a SET (no reply): applied after the next reply-bearing one
    assert not marks.applied(set_mark) and marks.needs_probe(set_mark)
    marks.wait(set_mark, "release the WAIT answer")
    marks.asked += 1  # a request with a reply follows the SET: no probe needed
    assert not marks.needs_probe(set_mark)
    assert marks.answer() == []  # the GET's reply proves only what went before it
    assert marks.answer() == ["release the WAIT answer"]
    assert marks.applied(set_mark)


def test_a_lost_connection_releases_everything_waiting_for_a_mark():
    marks: AppliedMarks[str] = AppliedMarks()
    marks.wait(marks.mark(), "a")
    marks.wait(marks.mark() + 1, "b")
    assert sorted(marks.drain()) == ["a", "b"]
    assert marks.drain() == []
