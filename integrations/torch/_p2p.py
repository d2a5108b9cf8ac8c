"""Point-to-point traffic: ``send``, ``recv``, ``isend``, ``irecv``, ``batch_isend_irecv``
(pipelining schedules), zero edits.

All of them reach the backend through two methods of the process group,
``ProcessGroup.send(tensors, peer, tag)`` and ``ProcessGroup.recv(tensors, peer, tag)``,
each returning a ``Work``: those two are wrapped, not the functions, whose identity
``P2POp`` checks (a ``P2POp`` made with a reference taken before stepscope started
still passes). Each call is recorded as an async ``comm`` event with its bytes and
its completion (where its ``wait`` returns, or its future completes: ``_collectives``);
its ``wait`` (the synchronous ``send``/``recv`` wait inside) is blocked time,
as any ``Work.wait``.

Matching across ranks: a channel per direction, named ``p2p:SRC>DST`` (global ranks):
the k-th send from SRC to DST is the k-th receive at DST from SRC (torch requires that
order within a direction). The k-th of a channel is collective (channel, k) in the
tables, so who waits for whom comes out of the same arrivals as for collectives: a
receiver blocked until its sender arrives waited for that sender. Tags are not told
apart (the NCCL backend has none); a receive from any source is not recorded.
"""

from __future__ import annotations

import functools

from stepscope.core.recording import COMM, counter, enabled, now, span
from stepscope.core.vocabulary import COMM_ASYNC, COMM_DONE, COMM_P2P, COMM_SEQ_BITS
from stepscope.integrations._frameless import frameless
from stepscope.integrations.torch._collectives import _bytes, _Group


class PointToPoint:
    def __init__(self, collectives):
        self.c, self.channels = collectives, {}  # (id(group), peer, kind) -> (weak group, _Group)

    def install(self) -> None:
        pg_class = getattr(self.c.c10d, "ProcessGroup", None)
        if pg_class is None:
            return
        for kind in ("send", "recv"):
            if callable(getattr(pg_class, kind, None)):
                self.c.ctx.patch(pg_class, kind, functools.partial(self.wrap, kind))

    def channel(self, group, peer: int, kind: str) -> _Group:
        key = (id(group), peer, kind)
        found = self.channels.get(key)
        if found is not None and found[0] is group:
            return found[1]
        c10d = self.c.c10d
        own, other = c10d.get_rank(), c10d.get_global_rank(group, peer)
        src, dst = (own, other) if kind == "send" else (other, own)
        named = f"{COMM_P2P}{src}>{dst}"
        found = self.c.groups.get(named)
        if found is None:
            found = self.c.groups[named] = _Group(named)
        self.channels[key] = (group, found)  # (a process group lives as long as the job)
        return found

    def wrap(self, kind, original):
        """Frameless (C): an error the transfer raises has the traceback it has without
        stepscope (dynamo does not trace a process group's methods either way)."""
        local, ctx = self.c.local, self.c.ctx

        def before(*args, **kwargs):
            if ctx.is_compiling() or local.inside or not enabled() or len(args) < 3:
                return None  # (by keyword: not a call torch's own functions make; not recorded)
            group, tensors, peer = args[:3]
            return args, kwargs, (group, tensors, peer, now())

        def after(token, exc, work):  # recorded once the call returned: never in the traffic's way
            if exc is not None:
                return
            group, tensors, peer, t0 = token
            t1 = now()
            channel = self.channel(group, int(peer), kind)
            channel.seq += 1
            name, arg = channel.name_id(kind), channel.seq | COMM_ASYNC << COMM_SEQ_BITS
            span(COMM, name, t0, t1, arg)
            counter(COMM, name, _bytes(tensors), arg, t0)
            if work is not None:
                self.c.pending(work, name, t0, t1, arg | COMM_DONE << COMM_SEQ_BITS, -1)

        return frameless(original, before, after, fail=ctx.fail, with_result=True)
