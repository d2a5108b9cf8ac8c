"""tf.data: GetNext and steps for loops that iterate a Dataset from Python.

    stepscope.integrations.tfdata.instrument()   # idempotent; automatic under STEPSCOPE=1

One patch: the eager fetch of an iterator (``OwnedIterator._next_internal``,
behind ``for batch in ds``, ``next(it)`` and ``it.get_next()``) is timed as
GetNext. Inside ``tf.function`` the same call only builds a graph op; it is
passed through untouched (one ``executing_eagerly()`` check, ~0.3 us).

Steps: in a Python loop over a dataset each fetch begins a ``train`` step
(the step runs to the next fetch, the last one ends where the iterator runs
out), whatever the loop body is -- eager code or a ``tf.function`` step. While
a Keras loop runs (``fit``/``evaluate``/``predict``), Keras owns the steps and
this integration only records the fetches as GetNext.

Not visible: a loop that iterates the dataset *inside* a ``tf.function``
(``for batch in ds`` compiled into the graph, as ``model.fit`` does with
``steps_per_execution > 1``) fetches in-graph; it is one Python call, so it
shows neither steps nor GetNext here. The Keras integration's sampled
profiler window recovers GetNext for its own compiled loops.
"""

from __future__ import annotations

import functools
from typing import Optional

from stepscope.core import _native, safety, session
from stepscope.integrations._steps import GETNEXT, PHASE, StepTracker

__all__ = ["instrument", "uninstrument", "is_instrumented"]

MODE = "train"


class _Instrumentation:
    def __init__(self, iterator_cls, executing_eagerly, out_of_range):
        self.iterator_cls = iterator_cls
        self.executing_eagerly = executing_eagerly
        self.out_of_range = out_of_range
        self.tracker = StepTracker()
        self.external_loops = 0  # Keras loops in progress: they mark the steps
        self.original = None

    def install(self) -> None:
        original = self.iterator_cls._next_internal
        inst = self

        def _next_internal(iterator):
            if not inst.executing_eagerly():
                return original(iterator)
            t0 = _native.now()
            try:
                batch = original(iterator)
            except inst.out_of_range:
                inst.record(t0, None)
                raise
            inst.record(t0, _native.now())
            return batch

        functools.update_wrapper(_next_internal, original)
        _next_internal.__stepscope_original__ = original
        self.iterator_cls._next_internal = _next_internal
        self.original = original
        session.on_stop(_close_steps)

    def uninstall(self) -> None:
        if self.original is not None:
            self.iterator_cls._next_internal = self.original
            self.original = None

    def record(self, t0: int, t1: Optional[int]) -> None:
        try:
            if self.external_loops:
                if t1 is not None:
                    _native.span(PHASE, GETNEXT, t0, t1)
            elif t1 is None:
                self.tracker.exhausted(t0)
            else:
                self.tracker.fetched(t0, t1, MODE)
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("the tf.data integration failed", exc)
            uninstrument()


_active: Optional[_Instrumentation] = None


def instrument() -> bool:
    """Times eager tf.data fetches (SPEC §1). Idempotent; returns True when instrumented.

    Imports tensorflow: call it when TensorFlow is in use.
    """
    global _active
    if _active is not None:
        return True
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise ImportError("stepscope.integrations.tfdata needs TensorFlow: pip install tensorflow") from exc
    try:
        from tensorflow.python.data.ops import iterator_ops
        from tensorflow.python.eager import context

        inst = _Instrumentation(iterator_ops.OwnedIterator, context.executing_eagerly, tf.errors.OutOfRangeError)
        inst.install()
    except Exception as exc:  # noqa: BLE001 - a TF version we do not know: this integration stays off
        safety.warn_once("tfdata", f"stepscope: cannot instrument tf.data of TensorFlow "
                                   f"{getattr(tf, '__version__', '?')} ({type(exc).__name__}: {exc}); "
                                   "tf.data is not profiled, the program continues unaffected")
        return False
    _active = inst
    return True


def uninstrument() -> None:
    global _active
    inst, _active = _active, None
    if inst is not None:
        inst.tracker.close()
        inst.uninstall()


def is_instrumented() -> bool:
    return _active is not None


def keras_loop_begins() -> None:
    """A Keras loop owns the steps from now on: fetches are only GetNext spans."""
    if _active is not None:
        _active.tracker.close()
        _active.external_loops += 1


def keras_loop_ends() -> None:
    if _active is not None and _active.external_loops:
        _active.external_loops -= 1


def _close_steps() -> None:
    if _active is not None:
        _active.tracker.close()


def _on_import(tensorflow_module) -> None:
    """Zero-edit mode: right after `import tensorflow` (see core.autostart)."""
    instrument()
