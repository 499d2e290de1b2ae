"""A small Wing–Gong linearizability checker and a sequential model of the TCPStore (pure).

A history is a list of :class:`Call`: one operation of one client, with the time its request was
sent (``invoked``) and the time its reply was read (``returned``). The check searches for a total
order of the calls that

* respects each client's program order (one connection is served in order, at the root and
  through the proxy),
* respects real time: a call that returned before another was invoked comes first,
* and in which every call's recorded result is what :func:`apply` gives on the state left by the
  calls before it.

Requests without a reply (SET, APPEND) have no return time of their own: the root has applied them
once a later request of the same connection is answered, so their ``returned`` is that answer's
time (infinite when none follows). A WAIT that timed out on the client constrains nothing (the
root may have been about to wake it); a WAIT that returned must find each of its keys present, or
touched after the WAIT was sent by a compare-and-set on the missing key: torch's libuv store server
wakes the waiters of a key on every compare-and-set, also one that finds the key missing and leaves
it missing (its "lying" branch), so straight to the root such a WAIT returns "ready" for a key that
does not exist. The model keeps, per key, the latest time such a compare-and-set may have happened
(its return), and a WAIT sent before it may count it as its wake-up.

Queues (torch's libuv root) live in the same state, each under a prefix, as their items joined by
NUL bytes. A pop answers the head or "empty"; a blocking pop (torch's WAIT, then QUEUE_POP) that
timed out constrains nothing, and one that woke answers the head, or "empty" when another client
took the item first; a push has no reply (its ``returned`` is its client's next answer, as a
SET's).

The search is Wing and Gong's, with Lowe's memo of (calls done, state) pairs already explored and
one shortcut: a call that may come next and leaves the state as it is (a read, a failed
compare-and-set) is taken at once without trying the others first, since moving it earlier can
never make a valid order invalid. Histories of a few hundred calls over few keys check in well
under a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

State = Tuple[Tuple[bytes, bytes], ...]  # sorted (key, value) pairs
# In the state dict, beside each key's value: the latest return time of a compare-and-set that
# found the key missing and woke its waiters (the libuv root's), under this prefix.
_TOUCHED = b"\x00touched:"
_QUEUE = b"\x00queue:"


@dataclass(frozen=True)
class Call:
    """One completed (or abandoned) operation of one client."""

    client: int
    op: str  # set get multi_get check delete add compare_set append wait queue_push queue_pop
    #          blocking_pop queue_len
    keys: Tuple[bytes, ...]
    args: Tuple[
        object, ...
    ]  # set/append: (value,); add: (delta,); compare_set: (expected, desired)
    result: object  # None for set/append/queue_push; "timeout"/"ready" (wait); "empty" (pops)
    invoked: float
    returned: float = math.inf

    def __str__(self) -> str:
        shown = ", ".join(_short(a) for a in self.args)
        return (
            f"client {self.client} {self.op}({b','.join(self.keys).decode()}"
            f"{', ' + shown if shown else ''}) -> {_short(self.result)} "
            f"[{self.invoked:.4f}, {self.returned:.4f}]"
        )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Inconsistent(AssertionError):
    """No order of the calls explains their results."""


def apply(state: Dict[bytes, bytes], call: Call) -> Tuple[bool, Dict[bytes, bytes]]:
    """The root's answer to ``call`` in ``state``: (recorded result matches, state after)."""
    op, keys = call.op, call.keys
    if op == "set":
        return True, {**state, keys[0]: call.args[0]}  # type: ignore[dict-item]
    if op == "append":
        return True, {**state, keys[0]: state.get(keys[0], b"") + call.args[0]}  # type: ignore[operator]
    if op == "get":
        return call.result == state.get(keys[0], b""), state
    if op == "multi_get":
        return call.result == tuple(state.get(k, b"") for k in keys), state
    if op == "check":
        return call.result == all(k in state for k in keys), state
    if op == "wait":
        return call.result == "timeout" or all(_woken(state, k, call.invoked) for k in keys), state
    if op == "delete":
        if keys[0] not in state:
            return call.result == 0, state
        after = dict(state)
        del after[keys[0]]
        return call.result == 1, after
    if op == "add":
        total = int(state.get(keys[0], b"0")) + call.args[0]  # type: ignore[operator]
        return call.result == total, {**state, keys[0]: str(total).encode()}
    if op == "compare_set":
        expected, desired = call.args
        current = state.get(keys[0])
        if current is None:
            if expected == b"":
                return call.result == desired, {**state, keys[0]: desired}  # type: ignore[dict-item]
            touched = _TOUCHED + keys[0]
            if call.returned > float(state.get(touched, b"-inf")):
                return call.result == expected, {**state, touched: repr(call.returned).encode()}
            return call.result == expected, state
        if current == expected:
            return call.result == desired, {**state, keys[0]: desired}  # type: ignore[dict-item]
        return call.result == current, state
    if op in ("queue_push", "queue_pop", "blocking_pop", "queue_len"):
        return _apply_queue(state, call)
    raise ValueError(f"no model for {op}")


def _apply_queue(state: Dict[bytes, bytes], call: Call) -> Tuple[bool, Dict[bytes, bytes]]:
    name = _QUEUE + call.keys[0]
    items = state[name].split(b"\x00") if name in state else []
    if call.op == "queue_len":
        return call.result == len(items), state
    if call.op == "queue_push":
        return True, {**state, name: b"\x00".join(items + [call.args[0]])}  # type: ignore[list-item]
    if call.result == "timeout":  # a blocking pop that gave up took nothing
        return True, state
    if not items:
        return call.result == "empty", state
    if call.result != items[0]:
        return False, state
    after = dict(state)
    if len(items) == 1:
        del after[name]
    else:
        after[name] = b"\x00".join(items[1:])
    return True, after


def _woken(state: Dict[bytes, bytes], key: bytes, invoked: float) -> bool:
    """A WAIT sent at ``invoked`` may return for ``key``: present, or touched since it was sent."""
    return key in state or float(state.get(_TOUCHED + key, b"-inf")) > invoked


@dataclass
class _Search:
    calls: Sequence[Call]
    previous: List[int]  # index of the same client's previous call, -1 for its first
    seen: set = field(default_factory=set)
    best: Tuple[int, ...] = ()


def check(history: Sequence[Call], initial: Optional[Dict[bytes, bytes]] = None) -> List[Call]:
    """A linearization of ``history`` (the calls in order), or raise :class:`Inconsistent`."""
    calls = sorted(history, key=lambda c: c.invoked)
    previous, last = [], {}
    for index, call in enumerate(calls):
        previous.append(last.get(call.client, -1))
        last[call.client] = index
    search = _Search(calls, previous)
    order = _search(search, 0, dict(initial or {}), ())
    if order is None:
        done = set(search.best)
        stuck = [str(calls[i]) for i in range(len(calls)) if i not in done][:12]
        linearized = [str(calls[i]) for i in search.best[-8:]]
        raise Inconsistent(
            "no linearization: longest prefix "
            f"{len(search.best)}/{len(calls)} calls, ending\n  "
            + "\n  ".join(linearized)
            + "\nnone of these can come next:\n  "
            + "\n  ".join(stuck)
        )
    return [calls[i] for i in order]


def _search(
    search: _Search, done: int, state: Dict[bytes, bytes], order: Tuple[int, ...]
) -> Optional[Tuple[int, ...]]:
    calls = search.calls
    # iterative DFS: a stack of (done, state, order) nodes
    stack = [(done, state, order)]
    while stack:
        done, state, order = stack.pop()
        if len(order) == len(calls):
            return order
        if len(order) > len(search.best):
            search.best = order
        key = (done, tuple(sorted(state.items())))
        if key in search.seen:
            continue
        search.seen.add(key)
        pending = [i for i in range(len(calls)) if not done >> i & 1]
        deadline = min(calls[i].returned for i in pending)
        children = []
        for i in pending:
            call = calls[i]
            if call.invoked > deadline:
                break  # sorted by invocation: every later call starts after some pending return
            before = search.previous[i]
            if before >= 0 and not done >> before & 1:
                continue
            ok, after = apply(state, call)
            if ok and after is state:
                # a call that changes nothing and may come next: taking it now loses no order
                # (everything it must follow is done; it only frees what must follow it)
                children = [(done | 1 << i, after, order + (i,))]
                break
            if ok:
                children.append((done | 1 << i, after, order + (i,)))
        stack.extend(reversed(children))
    return None
