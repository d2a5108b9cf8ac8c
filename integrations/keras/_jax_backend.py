"""Keras on JAX (issue 63, first part): the step function timed, and its fetch.

Keras's JAX trainer hands its step function the epoch's iterator; the function takes
its batch with ``next(iterator)`` before running the jitted step. The callback gives the
function a thin iterator that times that fetch (GetNext, inside the step the batch
callback began), and learns where each step's work ended and which call met the end of
the data (no step: SPEC §3), as on TensorFlow. The compute phases inside the jitted
step are not measured on this backend: a note says so (``NOTE``).
"""

from __future__ import annotations

from stepscope.core.recording import PHASE, now, span
from stepscope.integrations._frameless import frameless
from stepscope.integrations._steps import GETNEXT

NOTE = ("Keras on JAX: steps and GetNext are recorded; the compute phases inside the jitted step (Forward, Loss, "
        "Backward, Optimizer) are not measured on this backend: their time is in Other")


class _TimedIterator:
    """The epoch's iterator, each ``next`` a GetNext span."""

    __slots__ = ("_it",)

    def __init__(self, iterator):
        self._it = iterator

    def __iter__(self):
        return self

    def __next__(self):
        t0 = now()
        batch = next(self._it)
        span(PHASE, GETNEXT, t0, now())
        return batch


def _step_function(function, callback):
    """Keras's JAX step function ``(state, iterator)``, timed; frameless."""
    def before(state, iterator, *rest, **kwargs):
        return (state, _TimedIterator(iterator), *rest), kwargs, callback

    def after(callback, exc):
        if exc is None:
            callback._work_end = now()
        elif isinstance(exc, StopIteration):  # the data's end: the call belongs to no step
            callback._data_ended()
        else:
            callback._work_end = now()
            callback._step_failed()

    return frameless(function, before, after, "the Keras integration failed")
