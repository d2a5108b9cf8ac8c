"""Accelerate: its DataLoader wrappers read one batch ahead of the loop.

``DataLoaderShard`` and ``DataLoaderDispatcher`` iterate the real DataLoader
one batch ahead (to know which batch is the last). Timed at the DataLoader,
the loop's fetches would be shifted by a batch; so their ``__iter__`` is
wrapped to time what the loop receives, each ``next`` one fetch, with the
inner reads part of it (the torch integration's ``timed_fetches`` seam).
Accelerate's optimizer wrapper steps the real optimizer only on synchronising
micro-batches; the torch integration's optimizer hooks see exactly those.
"""

from __future__ import annotations

from stepscope.integrations._base import Instrumentor

__all__ = ["instrumentor"]


class AccelerateInstrumentor(Instrumentor):
    name = "accelerate"
    module = "accelerate"
    distribution = "accelerate"
    supported = ">=0.26"

    def _instrument(self) -> None:
        from accelerate import data_loader

        for name in ("DataLoaderShard", "DataLoaderDispatcher"):
            cls = getattr(data_loader, name, None)
            if cls is not None and "__iter__" in cls.__dict__:
                self.patch(cls, "__iter__", _timed_iter)


def _timed_iter(original):
    def __iter__(loader):
        from stepscope.integrations import torch as st_torch

        return st_torch.timed_fetches(original(loader))

    return __iter__


instrumentor = AccelerateInstrumentor()
