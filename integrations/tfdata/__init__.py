"""tf.data: GetNext and steps for loops that iterate a Dataset from Python.

    stepscope.integrations.tfdata.instrument()   # automatic under STEPSCOPE=1

Two patches: the eager fetch of an iterator (``OwnedIterator._next_internal``,
behind ``for batch in ds``, ``next(it)`` and ``it.get_next()``), and of a
``tf.distribute`` strategy's iterator (``DistributedIteratorBase.get_next``,
behind ``for batch in strategy.experimental_distribute_dataset(ds)``) are
timed as GetNext (a fetch inside another is the outer one's). Inside
``tf.function`` the same call only builds a graph op; it is passed through
untouched (one ``executing_eagerly()`` check, ~0.3 us).

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

import contextlib
import threading
from typing import Optional

from stepscope.core import _native, session
from stepscope.integrations._base import Instrumentor
from stepscope.integrations._frameless import frameless
from stepscope.integrations._steps import GETNEXT, PHASE, StepTracker

__all__ = ["instrument", "uninstrument", "is_instrumented", "instrumentor", "keras_loop_begins",
           "keras_loop_ends", "keras_loop"]

MODE = "train"


class TfDataInstrumentor(Instrumentor):
    name = "tf.data"
    module = "tensorflow"
    distribution = "tensorflow"
    supported = ">=2.12"

    def __init__(self):
        super().__init__()
        self.tracker = StepTracker()
        self.external_loops = 0  # Keras loops in progress: they mark the steps
        self.noted = False  # run.json says what a custom loop's profile lacks

    def _instrument(self) -> None:
        import tensorflow as tf
        from tensorflow.python.data.ops import iterator_ops
        from tensorflow.python.eager import context

        executing_eagerly, out_of_range = context.executing_eagerly, tf.errors.OutOfRangeError
        self.tracker = StepTracker()
        self.external_loops = 0
        self.noted = False
        inst = self
        fetching = threading.local()  # a fetch in progress on this thread: inner ones are part of it

        def before(iterator, *args, **kwargs):
            if not executing_eagerly() or getattr(fetching, "on", False):
                return None
            fetching.on = True
            return (iterator, *args), kwargs, _native.now()

        def after(t0, exc):
            fetching.on = False
            if exc is None:
                inst.record(t0, _native.now())
            elif isinstance(exc, out_of_range):
                inst.record(t0, None)

        def wrap(original):  # frameless: a dataset's error shows no stepscope frame
            return frameless(original, before, after, "the tf.data integration failed")

        self.patch(iterator_ops.OwnedIterator, "_next_internal", wrap)
        try:
            from tensorflow.python.distribute.input_lib import DistributedIteratorBase
        except ImportError:  # moved in a TensorFlow we do not know: strategy loops show no steps
            DistributedIteratorBase = None
        if hasattr(DistributedIteratorBase, "get_next"):
            self.patch(DistributedIteratorBase, "get_next", wrap)
        session.on_stop(self.close_steps)

    def _uninstrument(self) -> None:
        self.tracker.close()

    def close_steps(self) -> None:
        if self._on:
            self.tracker.close()

    def record(self, t0: int, t1: Optional[int]) -> None:
        if not self._on:
            return
        try:
            if self.external_loops:
                if t1 is not None:
                    _native.span(PHASE, GETNEXT, t0, t1)
            elif t1 is None:
                self.tracker.exhausted(t0)
            else:
                if not self.noted:
                    self.noted = True
                    session.add_note("tf.data: a custom loop over a dataset records its steps and GetNext; the "
                                     "compute phases of its steps (eager code or a tf.function) are not "
                                     "measured (the Keras callback samples them for model.fit)")
                self.tracker.fetched(t0, t1, MODE)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)


instrumentor = TfDataInstrumentor()


def instrument() -> bool:
    """Times eager tf.data fetches (SPEC §1); True when instrumented. A second
    call warns and does nothing. Imports tensorflow: call it when TensorFlow is in use."""
    try:
        import tensorflow  # noqa: F401
    except ImportError as exc:
        raise ImportError("stepscope.integrations.tfdata needs TensorFlow: pip install tensorflow") from exc
    return instrumentor.instrument(stacklevel=3)


def uninstrument() -> None:
    instrumentor.uninstrument()


def is_instrumented() -> bool:
    return instrumentor.is_instrumented()


def keras_loop_begins() -> None:
    """A Keras loop owns the steps from now on: fetches are only GetNext spans."""
    if instrumentor.is_instrumented():
        instrumentor.tracker.close()
        instrumentor.external_loops += 1


def keras_loop_ends() -> None:
    if instrumentor.is_instrumented() and instrumentor.external_loops:
        instrumentor.external_loops -= 1


@contextlib.contextmanager
def keras_loop():
    """Keras at work outside its loops' callbacks (building a model on a first batch):
    its fetches are GetNext spans, not steps."""
    keras_loop_begins()
    try:
        yield
    finally:
        keras_loop_ends()
