"""GetNext: ``DataLoader.__iter__`` (a pass begins: its worker start belongs to
the first fetch). Each fetch itself is the ``record_function`` range torch
enters in ``_BaseDataLoaderIter.__next__``, reported in native code
(``_annotations.py``, ``csrc/torch/record_function.cc``); ``wrap_next`` times any other
iterator's ``next`` the same way (``timed_fetches``). Whatever runs inside a
fetch (an ``nn.Module`` transform in ``__getitem__``) is part of the fetch,
never a forward.
"""

from __future__ import annotations

import functools
import weakref

from stepscope.core import recording
from stepscope.integrations.torch import _native_hooks, _workers


def wrap_iter(ctx, original):
    """``DataLoader.__iter__``, native (``csrc/torch/passes.cc``): a pass begins on every epoch,
    every few steps for a small dataset, where a Python wrapper cost six frames."""
    return _native_hooks.timed_iter(original=original, state=ctx.loops.local, seen=ctx.loaders_seen,
                                    on_new=functools.partial(_new_loader, ctx),
                                    on_workers=_workers.loader_configured, fail=ctx.fail)


def _new_loader(ctx, loader) -> None:
    """A loader not iterated before may feed a model not seen yet: discovery looks
    until a known root runs (None: a loader that cannot be weakly referenced)."""
    if loader is not None:
        ctx.loaders_seen.add(weakref.ref(loader, ctx.loaders_seen.discard))
    ctx.roots.look_again(until_known_root=True)


def loop_starting(ctx, t0: int, loader=None) -> None:
    """A pass over a loader begins (its worker start belongs to the first fetch),
    told by a framework's own loop (``csrc/torch/passes.cc`` tells a DataLoader's). The
    same loader's next epoch is the same loop."""
    st = ctx.loops.local.s
    if st.iter_started is not None or st.depth:
        return
    st.iter_started = t0
    try:
        new = loader is None or weakref.ref(loader) not in ctx.loaders_seen
    except TypeError:  # a loader that cannot be weakly referenced
        new, loader = True, None
    if new:
        _new_loader(ctx, loader)
    try:
        st.tracker.loop_started()
    except Exception as exc:  # noqa: BLE001
        ctx.fail(exc)


def wrap_next(ctx, original):
    """``next`` of any iterator timed as one fetch (``timed_fetches``), as the
    native route times a DataLoader's: its mode is left to the work that follows."""
    loops, now, fail = ctx.loops, recording.now, ctx.fail

    def __next__(loader_iter):
        t0 = now()
        st = loops.local.s
        if st.iter_started is not None:
            t0, st.iter_started = min(t0, st.iter_started), None
        st.depth += 1  # modules run by the dataset or collate are part of the fetch
        try:
            batch = original(loader_iter)
        except StopIteration:
            st.depth -= 1
            if not st.depth:
                try:
                    st.tracker.exhausted(t0, now())
                except Exception as exc:  # noqa: BLE001
                    fail(exc)
            raise
        except BaseException:
            st.depth -= 1
            raise
        st.depth -= 1
        if not st.depth:
            try:
                st.tracker.fetched(t0, now(), None)
            except Exception as exc:  # noqa: BLE001
                fail(exc)
        return batch

    return __next__
