"""DataLoader workers: the work behind GetNext.

The training loop's GetNext is how long it waited; the worker processes are
where the batches were made. Each worker (forked or spawned: it joined the run
with a process folder of its own) records one ``DataLoader.fetch`` span per
batch it builds (``__getitem__``s and collate), with its worker id as the
argument, so analysis can tell a slow worker from a slow loop (the Dataloader
rule, the report's data-loading section, smdebug's dataloader frame).

The main process records, at each pass over a multi-process loader, how the
loader was configured: ``DataLoader.num_workers``, ``DataLoader.pin_memory`` and
``DataLoader.persistent_workers`` (instants whose argument is the value).

Only the worker processes pay for the fetch spans: the patch of the fetchers is
made inside ``_worker_loop``, which only workers run.
"""

from __future__ import annotations

import functools

from stepscope.core import recording
from stepscope.core.recording import FRAMEWORK, intern
from stepscope.core.vocabulary import LOADER_FETCH, LOADER_NUM_WORKERS, LOADER_PERSISTENT, LOADER_PIN_MEMORY

FETCH = intern(LOADER_FETCH)
NUM_WORKERS = intern(LOADER_NUM_WORKERS)
PIN_MEMORY = intern(LOADER_PIN_MEMORY)
PERSISTENT = intern(LOADER_PERSISTENT)


def install(ctx) -> None:
    from torch.utils.data._utils import worker as worker_mod

    if hasattr(worker_mod, "_worker_loop"):
        ctx.patch(worker_mod, "_worker_loop", functools.partial(_wrap_worker_loop, ctx.fail, ctx.torch))


def loader_configured(loader) -> None:
    """A pass over ``loader`` begins (main process): note its worker setup."""
    workers = getattr(loader, "num_workers", 0)
    if workers:
        recording.instant(FRAMEWORK, NUM_WORKERS, int(workers))
        recording.instant(FRAMEWORK, PIN_MEMORY, int(bool(getattr(loader, "pin_memory", False))))
        recording.instant(FRAMEWORK, PERSISTENT, int(bool(getattr(loader, "persistent_workers", False))))


def _wrap_worker_loop(fail, torch, original):
    def _worker_loop(*args, **kwargs):
        try:
            _time_fetches(torch)
        except Exception as exc:  # noqa: BLE001 - the worker makes its batches regardless
            fail(exc)
        return original(*args, **kwargs)

    return _worker_loop


def _time_fetches(torch) -> None:
    """In a worker process: each fetcher's fetch becomes a span (this process only)."""
    from torch.utils.data._utils import fetch as fetch_mod

    worker_id = [None]
    now, span = recording.now, recording.span

    def timed(original):
        @functools.wraps(original)
        def fetch(fetcher, possibly_batched_index):
            t0 = now()
            batch = original(fetcher, possibly_batched_index)
            if worker_id[0] is None:
                info = torch.utils.data.get_worker_info()
                worker_id[0] = info.id if info is not None else -1
            if worker_id[0] >= 0:
                span(FRAMEWORK, FETCH, t0, now(), worker_id[0])
            return batch

        return fetch

    for name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
        cls = getattr(fetch_mod, name, None)
        if cls is not None and "fetch" in vars(cls) and not getattr(cls.fetch, "_stepscope_timed", False):
            cls.fetch = timed(cls.fetch)
            cls.fetch._stepscope_timed = True
