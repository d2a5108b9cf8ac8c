"""tf.data: GetNext and steps for loops that iterate a Dataset from Python.

    stepscope.integrations.tfdata.instrument()   # automatic under STEPSCOPE=1

Two patches: the eager fetch of an iterator (``OwnedIterator._next_internal``,
behind ``for batch in ds``, ``next(it)`` and ``it.get_next()``), and of a
``tf.distribute`` strategy's iterator (``DistributedIteratorBase.get_next``,
behind ``for batch in strategy.experimental_distribute_dataset(ds)``) are
timed as GetNext (a fetch inside another is the outer one's). Inside
``tf.function`` the same call only builds a graph op; it is passed through
untouched (one ``executing_eagerly()`` check, ~0.3 us).

Steps: in a Python loop over a dataset each fetch begins a step (it runs to
the next fetch, the last one ends where the iterator runs out), whatever the
loop body is -- eager code or a ``tf.function`` step. Its mode comes from the
work on its batch (``_modes``): a GradientTape makes it train, a ``tf.function``
that computes none eval (a validation loop), and a dataset iterated after
the training one ran out is evaluation; a step with no evidence is train and
run.json says how many. While
a Keras loop runs (``fit``/``evaluate``/``predict``), Keras owns the steps and
this integration only records the fetches as GetNext.

A loop that no fetch drives (batches from a Python generator, a list, NumPy slices)
has its steps from its optimizer (``_optimizers``): one train step per eager call of
a ``tf.function`` whose tracing applied an optimizer's gradients (``jit_compile`` or
not), or per eager ``apply_gradients``, which is then the step's Optimizer phase;
such a step begins at the call (an eager step at its GradientTape) and has no
GetNext. A fetch since the loop's last train work means a fetch drives it: then
the fetches make the steps, as above.

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

from stepscope.core import annotations, session
from stepscope.core.recording import PHASE, begin_step, end_step, now, span
from stepscope.integrations._base import Instrumentor
from stepscope.integrations._frameless import frameless
from stepscope.integrations._steps import GETNEXT, OPTIMIZER, StepTracker
from stepscope.integrations.tfdata import _modes, _optimizers, _tracing

__all__ = ["instrument", "uninstrument", "is_instrumented", "instrumentor", "keras_loop_begins",
           "keras_loop_ends", "keras_loop", "optimizer_apply_wrapper"]

UNFED_NOTE = ("TensorFlow: a custom loop that no tf.data fetch drives (its batches from Python): one train step "
              "per call of the function that applies the optimizer's gradients (or per eager apply_gradients); "
              "no GetNext, and the phases inside a tf.function are not measured")



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
        self.modes = _modes.Modes()
        self.stepped = False  # a custom loop made steps since the last loop mark
        self.fetches = 0  # eager fetches that gave a batch
        self.work_fetches = 0  # ...as the last train work was seen: none since means no fetch drives the loop
        self.keras_calls = 0  # Keras's train_on_batch in progress: it marks its own step
        self.unfed_noted = False
        self.unfed_open = False  # a step of a loop no fetch drives is open (marked here, not by the tracker)
        self.unfed_end = 0  # ...where its work ended
        self.tape_at = 0  # the first eager GradientTape since the last train work (where an eager step began)

    def new_loop(self) -> None:
        """A new optimizer after a custom loop's steps (the next model, fold or trial): another
        loop (SPEC §3). The open step, if any, ends here; the next fetch begins the next loop."""
        if self._on and self.stepped and not self.external_loops:
            self.stepped = False
            self.end_unfed()
            self.tracker.close()
            annotations.new_loop()

    def _instrument(self) -> None:
        import tensorflow as tf
        from tensorflow.python.data.ops import iterator_ops
        from tensorflow.python.eager import context

        executing_eagerly, out_of_range = context.executing_eagerly, tf.errors.OutOfRangeError
        self.tracker = StepTracker()
        self.external_loops = self.keras_calls = 0
        self.noted = self.unfed_noted = False
        self.fetches = self.work_fetches = self.unfed_end = self.tape_at = 0
        self.unfed_open = False
        inst = self
        fetching = threading.local()  # a fetch in progress on this thread: inner ones are part of it

        def before(iterator, *args, **kwargs):
            if not executing_eagerly() or getattr(fetching, "on", False):
                return None
            fetching.on = True
            return (iterator, *args), kwargs, (now(), iterator)

        def after(token, exc):
            fetching.on = False
            t0, iterator = token
            if exc is None:
                inst.record(t0, now(), getattr(iterator, "_dataset", None))
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
        self._watch_modes(executing_eagerly)
        _optimizers.patch_tf_v1(self, executing_eagerly)
        _tracing.install(self)
        session.on_stop(self.close_steps)

    def _watch_modes(self, executing_eagerly) -> None:
        """Evidence of a custom loop's mode (``_modes``): GradientTapes, and tf.function calls."""
        from tensorflow.python.eager import backprop
        from tensorflow.python.eager.polymorphic_function import polymorphic_function

        modes = self.modes = _modes.Modes()
        self.tracker.guess = modes.guess
        inst = self

        def tape(tape, *args, **kwargs):
            if not inst.external_loops:
                eager = executing_eagerly()
                modes.tape(eager)
                if eager and not inst.tape_at and inst.fetches == inst.work_fetches:
                    inst.tape_at = now()  # where an eager step of a loop no fetch drives began
            return None

        def call(fn, *args, **kwargs):
            if inst.external_loops or not executing_eagerly() and not modes.calls:
                return None
            return (fn, *args), kwargs, (fn, modes.function_called(fn), now())

        def returned(token, exc):
            fn, outermost, t0 = token
            modes.function_returned(fn, outermost, exc is not None)
            if outermost and exc is None and fn in modes.applying_functions:
                inst.step_function_ran(fn, t0, now())

        self.patch(backprop.GradientTape, "__enter__",
                   lambda original: frameless(original, tape, None, "the tf.data integration failed"))
        self.patch(polymorphic_function.Function, "__call__",
                   lambda original: frameless(original, call, returned, "the tf.data integration failed"))

    def _uninstrument(self) -> None:
        self.end_unfed()
        self.tracker.close()

    def unfed(self) -> bool:
        """Train work is seen: whether no fetch came since the last (no fetch drives this loop)."""
        fed = self.fetches != self.work_fetches
        self.work_fetches = self.fetches
        self.tape_at = 0
        if not fed and not self.unfed_noted:
            self.unfed_noted = True
            session.add_note(UNFED_NOTE)
        return not fed

    def step_function_ran(self, fn, t0: int, t1: int) -> None:
        """An eager call of a tf.function that applies an optimizer's gradients returned."""
        if not self._on or self.external_loops or self.keras_calls:
            return
        try:
            if self.unfed():
                self.unfed_step(t0, t1)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def optimizer_applied(self, optimizer, t0: int, t1: int, eager: bool) -> None:
        """An optimizer's apply returned (``_optimizers``): traced, its function applies
        gradients; eager, the step's Optimizer phase."""
        if not self._on or self.external_loops or self.keras_calls:
            return
        try:
            self.modes.optimizer_seen = True
            if not eager:
                self.modes.applying()
                return
            self.modes.saw(_modes.TRAIN)
            began = self.tape_at or t0
            if self.unfed():
                self.unfed_step(began, t1)
            span(PHASE, OPTIMIZER, t0, t1)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def unfed_step(self, t0: int, t1: int) -> None:
        """A train step of a loop no fetch drives, begun at t0, its work ended at t1: it lasts
        until the next one begins (the last one, until its work ended)."""
        if not self.unfed_open:
            self.tracker.close()  # a loop fetches drove ends where its work ended
        begin_step(_modes.TRAIN, t0)
        self.unfed_open, self.unfed_end, self.stepped = True, t1, True

    def end_unfed(self) -> None:
        if self.unfed_open:
            self.unfed_open = False
            end_step(self.unfed_end)

    def close_steps(self) -> None:
        if self._on:
            self.end_unfed()
            self.tracker.close()
            self._say_what_ran()
            if self.modes.undetermined:
                session.add_note(f"tf.data: the mode of {self.modes.undetermined} step(s) of a custom loop could "
                                 "not be told (no GradientTape, no tf.function call on their batch, their dataset "
                                 "not seen in another mode): recorded as train")

    def _say_what_ran(self) -> None:
        """No step came from a custom loop: what ran, so the summary can name the loop's shape."""
        ran, modes = self.modes.ran, self.modes
        if self.fetches or self.unfed_noted or not ran:
            return
        calls = ", ".join(f"{name} ({n}x)" for name, n in sorted(ran.items(), key=lambda kv: -kv[1]))
        taped = sorted({getattr(f, "__name__", "function") for f in list(modes.training_functions)})
        how = (f"{', '.join(taped)} traced a GradientTape but applied no optimizer stepscope knows (a Keras 3, "
               "tf.keras or tf.compat.v1 optimizer's apply_gradients)" if taped else
               "none of them traced a GradientTape")
        session.add_note(f"tf.data: no step of a custom loop: tf.function calls {calls} ran eagerly, with no tf.data "
                         f"fetch in Python; {how}, so where the loop's iterations begin was not seen")

    def record(self, t0: int, t1: Optional[int], dataset=None) -> None:
        if not self._on:
            return
        try:
            if self.external_loops:
                if t1 is not None:
                    span(PHASE, GETNEXT, t0, t1)
            elif t1 is None:
                self.tracker.exhausted(t0)
                self.modes.exhausted()
            else:
                if not self.noted:
                    self.noted = True
                    session.add_note("tf.data: a custom loop over a dataset records its steps and GetNext; the "
                                     "compute phases of its steps (eager code or a tf.function) are not "
                                     "measured (the Keras callback samples them for model.fit)")
                self.end_unfed()
                self.tracker.fetched(t0, t1, None)  # its mode: from its work (_modes), asked later
                self.fetches += 1
                self.modes.fetched(dataset)
                self.stepped = True
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
        instrumentor.end_unfed()
        instrumentor.tracker.close()
        instrumentor.external_loops += 1


def keras_loop_ends() -> None:
    if instrumentor.is_instrumented() and instrumentor.external_loops:
        instrumentor.external_loops -= 1


def optimizer_apply_wrapper(executing_eagerly):
    """The wrapper maker for a Keras optimizer's apply on TensorFlow (``_optimizers``)."""
    return _optimizers.wrapper(instrumentor, executing_eagerly)


@contextlib.contextmanager
def keras_loop():
    """Keras at work outside its loops' callbacks (building a model on a first batch):
    its fetches are GetNext spans, not steps."""
    keras_loop_begins()
    try:
        yield
    finally:
        keras_loop_ends()
