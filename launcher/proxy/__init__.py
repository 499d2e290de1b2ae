"""The per-node store proxy: local TCPStore clients in, a few coalesced connections to the root out.

Local workers connect to ``127.0.0.1:<port>`` with unmodified torch clients (``TCPStore(...,
is_master=False)`` and the C++ client that ``init_process_group`` creates) and speak the native
wire protocol (:mod:`npu_job.launcher.protocol`). The proxy talks to the root store (a stock torch
``TCPStore`` server) over a small, bounded set of upstream connections, whatever the number of
local workers:

* one **main** connection carries every non-blocking request, pipelined. Replies come back in
  request order, so futures are matched FIFO, and a worker's own SET-then-GET is ordered by the
  single stream (read-your-writes);
* a pool of ``wait_connections`` (default 2) **wait** connections each carries one blocking WAIT
  (the root holds a connection while it waits, so WAITs cannot share the main stream). A distinct
  wait beyond the pool gets an extra connection of its own, closed once answered: only a WAIT
  registered at the root sees a key that is set and deleted at once (a CHECK poll between the two
  misses it), so distinct waits are not merged, and not polled.

So the root sees 1 + ``wait_connections`` connections per node (3 by default; 4 with the agent's
own), and for as long as more distinct waits than that are in flight (gloo's ranks wait on keys
of their own in ``init_process_group``), one more per such wait: never more than one per worker,
as without a proxy. BARRIER, which no torch code
path uses and which cannot be merged (every arrival must count once at the root), takes an idle wait
connection or, if none is idle, a short-lived extra one (closed after its answer; an extra that
comes up after the pool did is still the one taken).

Coalescing (what a one-for-one forwarder cannot do; its rules are pure code in
:mod:`.coalescing`, the server that applies them on an event loop is :mod:`.server` with its
worker connections in :mod:`.client` and its blocking requests in :mod:`.waits`, its connections
to the root :mod:`.upstream`; :mod:`.storeproxy` runs the server on a thread, and
``python -m npu_job.launcher.proxy`` as a command):

* identical GETs and CHECKs share one upstream request, and identical WAITs (same key list) one
  upstream WAIT, under one rule (the contract): **a client request is answered from an upstream
  request that the proxy sent after that client request arrived**. So the root computed the answer
  at an instant between the client's request and its reply, the answer is one the root could have
  given that client, and the proxy is linearizable with respect to the root, key by key and across
  keys. Concretely: a GET or CHECK joins only a request still in the proxy's outgoing batch of the
  main connection (its ``Batch`` is not yet ``sent``; the tables of joinable requests are emptied
  when the batch is written, ``on_sent``), and not one that a local write to any of its keys was
  queued after (DELETE_KEY/QUEUE_POP for WAITs): the client that wrote must read its write. A WAIT
  may join a group whose upstream WAIT has already been sent, but then only as a *late* waiter: when
  that answer is "ready", the late waiters form a new group whose own upstream WAIT is sent after
  they arrived (a key deleted at the root in between keeps them waiting, as it would at the root).
  Bursts that arrive in one loop turn (every worker asking for the same key at once) still share one
  request. Per client, order is the root's: its requests go upstream in arrival order on the main
  connection, and a WAIT answer (served on a wait connection) is held until the main connection has
  answered a request sent after the client's latest no-reply write (``waits``' ``_answer_wait``).
  A GET that joined any one in flight could join one sent long before, still queued behind large
  replies on the main connection, and return a value older than a write another node had completed;
* concurrent ADDs to one key are summed into one upstream ADD (group commit: while one ADD to a
  key is in flight, later ones accumulate); with root reply ``total`` for a batch of deltas
  ``d1..dn`` the i-th caller gets ``total - sum(d) + d1 + ... + di`` - distinct values, as if the
  ADDs ran alone in arrival order;
* PING is answered locally. Nothing is cached across time.

Replies reach clients as the root's own bytes (:mod:`.upstream` frames them without decoding the
values; the proxy speaks its root's dialect on both sides), so a large value costs about what a
plain relay costs: it is read from the root's socket straight into the buffer it is written from,
and the callers of a coalesced GET all get that one reply's bytes. The proxy decodes only what it
acts on: ADD totals, WAIT and CHECK answers, PING echoes, a QUEUE_POP's queue length.

Keys used with QUEUE_* ops are never coalesced for WAIT (a queue push wakes one waiter only).
A key first used as a queue by several workers' simultaneous blocking ``queue_pop`` (WAIT is the
first thing the proxy sees of it) can still be merged once. So a WAIT on a key that may be a
queue's is first a CHECK: "ready" (a value, or items) answers every waiter that arrived before it
went, as the root answers WAITs on a key that is there; only "not ready" sends an upstream WAIT.
A wake-up of that WAIT shared by several waiters may be a write (all wake) or a push (one wakes):
all are held while a QUEUE_LEN of the key, sent after the wake-up, tells. 0, and all are answered;
more, and one (the lead) is answered and the rest wait on, with an upstream WAIT sent after the
lead's pop, so they time out, or take the next item, as at the root (``waits``' ``_finish_group``).
One race is left: an item taken by another node's pop between the push and that QUEUE_LEN reads
as a write, and every held popper wakes to an empty queue (``QueueEmptyError``), where at the
root one would. Waiters that arrive while a CHECK is out are asked for with another CHECK (up to
three rounds) with the rest held, so workers a moment apart are answered together and keep
sharing requests.

Threading: ``StoreProxy`` runs the asyncio loop on a background thread. Some torch client calls
(``list_keys``, ``queue_len``, ``queue_pop``) hold the GIL while blocked on their socket: made in
the same process against this proxy they deadlock it, and against any store they pause it for
that round trip. Clients are ``asyncio.BufferedProtocol`` callbacks, not tasks, and the loop is
uvloop when it is importable (``new_event_loop``): the proxy's CPU per relayed request is the
price of tiering when many proxies share a machine (``benchmarks/bench_rendezvous.py`` measures
it; docs/benchmarks.md has the figures).

Memory per client is bounded (back-pressure, :mod:`.client`): the proxy takes a client's next
request only while it owes that client fewer than 4 replies (``MAX_REPLIES_OWED``; torch's own
clients never have more than one request in flight) and less than 64 KiB (``WRITE_HIGH_WATER``)
waits unsent in that client's transport. Otherwise it stops reading that connection, and the
client's further requests wait in the kernel's socket buffers (TCP flow control slows that client
alone; torch's libuv root instead keeps every unread reply in memory, its classic one stalls every
client). So a client that never reads its replies costs the proxy at most 64 KiB plus four replies
(32 MiB with the largest value a root takes in one SET, 8 MiB) plus one read (64 KiB) of requests
not yet taken, however many requests it pipelines; only its own connection slows down, the
connections to the root and every other client go on at full speed. Across clients, the proxy keeps
up to 64 MiB of the buffers large reply strings were read into (``LARGE_BUFFERS_KEPT``) to read
the next ones into, rather than allocating (and page-faulting) fresh ones: a quarter less CPU per
GiB relayed on asyncio. Requests bound for a root that reads slower than they come (no-reply
writes owe no reply, so the per-client caps do not stop them) are not queued without end either:
while the main connection's transport holds its high-water mark, the proxy takes no client's
requests, and they wait in the clients' socket buffers, as straight to a stalled root.

Faults: a request that makes the root drop the connection it came on fails only its own client, as
straight to the root. A well-formed client can send five such requests (malformed ones are refused
by the proxy itself, per client): an ADD to a key that holds no number (either server), a GET or
MULTI_GET of a missing key (torch's classic server, the only one on 2.1 and the one a listen fd
gets on 2.4-2.7, looks the key up with ``at`` and drops the connection; the libuv one answers), and
a QUEUE_LEN or QUEUE_POP (the classic server has no queues; the proxy's own QUEUE_LEN after a
shared wake-up, see ``waits``, learns that way that its root has none). When the main connection
ends with one of them as its first unanswered request, its callers fail (each, straight to the
root, would have lost its own connection: coalesced callers all arrived before it was sent) and the
requests queued behind it, which the root never read, are sent again first on a new main connection
(``upstream.Upstream._replayable``). Partial requests behave as at the root: the complete pairs of
a MULTI_SET whose client died mid-request are stored. Any other upstream connection that breaks
fails the requests in flight on it (their clients' connections are closed, so torch raises naming
the proxy's address), and a main one also closes the clients whose no-reply writes (SET, APPEND,
...) went on it unconfirmed: the root may never have read them, and straight to the root such a
client's own connection broke (kept open, its next read would miss its own write on the new
connection); if the root cannot be reached again at once, every client connection is closed. New
requests reconnect with backoff and jitter until ``timeout``. A client that disconnects has its
waits dropped (and cancelled upstream with CANCEL_WAIT when no other local worker shares them), so
the proxy survives worker restarts.
"""
