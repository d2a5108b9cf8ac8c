"""torch.distributed: the rank and world size a process joins with."""

from __future__ import annotations

import sys

from stepscope.core import runinfo
from stepscope.integrations._frameless import frameless
from stepscope.integrations.torch import _clocksync


def _as_is(*args, **kwargs):
    return args, kwargs, None


def patch_init_process_group(ctx) -> None:
    """Remember the rank a process joins with: torch.multiprocessing.spawn's
    children have no RANK in their environment, and scripts destroy the
    group before they exit. Then, in the background, measure this host's clock
    offset to rank 0's (``_clocksync``: through the rendezvous store, never a
    collective on the user's communicator)."""
    dist = getattr(ctx.torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    from torch.distributed import distributed_c10d

    def joined(token, exc) -> None:
        if exc is not None:  # the group was not made: the user's error, as it is
            return
        try:
            rank, world = dist.get_rank(), dist.get_world_size()
            runinfo.note_rank(rank, world)
            _clocksync.start(dist, rank, world)
        except Exception:  # noqa: BLE001 - the rank is a nicety, the group is the user's
            pass

    def wrap(original):
        # frameless (C): when init_process_group raises (a wrong address, a timeout), the
        # traceback the user reads is torch's own, with no frame of stepscope's in it
        return frameless(original, _as_is, joined, "the torch.distributed integration failed")

    wrapped = ctx.patch(distributed_c10d, "init_process_group", wrap)
    if wrapped is not None and getattr(dist, "init_process_group", None) is not wrapped:
        ctx.replace(dist, "init_process_group", wrapped)


def distributed_rank():
    """(rank, world size) of an initialised torch.distributed process group, or None."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None
