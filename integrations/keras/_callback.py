"""The Keras callback: steps from the batch hooks, GetNext and sampled phases."""

from __future__ import annotations

import sys

from stepscope.core import annotations, safety
from stepscope.core.recording import FRAMEWORK, begin_step, end_step, intern, interrupt_step, now, span, void_step
from stepscope.core.vocabulary import END_OF_DATA
from stepscope.integrations._late_class import late_class
from stepscope.integrations.keras._backend_hooks import backend_hooks
from stepscope.integrations.keras._tf_backend import _has_strategy, _step_function
from stepscope.integrations.keras._torch_backend import _torch_mode_begins, _torch_mode_ends, _torch_tracker

MODES = {"train": "train", "test": "eval", "predict": "predict"}
# The moments of a fit between its epochs' steps (SPEC §3), as framework spans (docs/design.md):
# from the epoch's last train step to its first validation batch, and from the epoch's last
# step (validation's, or training's) to the next epoch's first batch (or the loop's end).
VALIDATION_START = "keras.validation_start"
EPOCH_END = "keras.epoch_end"
BETWEEN_EPOCHS = (VALIDATION_START, EPOCH_END)
# The backends whose steps the callback marks itself (on torch the PyTorch step tracker does)
STEPPED_HERE = ("tensorflow", "jax")
FIT = "keras.fit"  # a fit's loop, on_train_begin to on_train_end: what its steps and intervals cover
_FITS = [0]  # the fits this process began: from the second on, each is another loop (SPEC §3)


def _backend(keras) -> str:
    return keras.backend.backend()


@late_class("stepscope.integrations.keras", "StepscopeCallback")
def _build_class(keras):
    class StepscopeCallback(keras.callbacks.Callback):
        """Steps, GetNext and sampled phases of ``fit``/``evaluate``/``predict``.

        Keywords are those of ``stepscope.start``; a session is started if none
        runs (it records until ``stepscope.stop()`` or the end of the process).
        """

        async_safe = True  # no batch-end hooks: Keras may keep its async dispatch

        def __init__(self, **start_kwargs):
            super().__init__()
            self._start_kwargs = start_kwargs
            self._loops: list = []  # (mode, restore) of the loops in progress, innermost last
            self._open = False  # a step of ours is open
            self._step_begin = 0
            self._execution = None  # (mode, first batch) of the open execution of steps_per_execution steps
            self._work_end = 0  # tick: end of the open step's compiled call, when known
            self._last_end = 0  # tick: where the last step closed by _end_step ended
            self._boundary = None  # (span name, start tick) of the between-epochs interval in progress
            self._fit_begin = 0  # tick: on_train_begin of the fit in progress
            self._sampler = None
            self._off = False
            try:
                backend_hooks.ensure()  # before fit: its first batch may run before on_train_begin
            except Exception as exc:  # noqa: BLE001
                safety.report_failure("the Keras integration failed", exc)

        # --- loops ---------------------------------------------------------------
        def _begin(self, kind: str) -> None:
            if self._off:
                return
            from stepscope.core import session

            if not backend_hooks.ensure():  # a Keras version it does not know: off, one line
                self._off = True
                return
            if session.current() is None:
                session.start(**self._start_kwargs)
            mode = MODES[kind]
            self._close_window()
            self._end_step()
            restore = None
            backend = _backend(keras)
            if kind == "test" and self._in_fit() and backend in STEPPED_HERE:
                self._boundary_begins(VALIDATION_START)
            if kind == "train":
                self._fit_begin = now()
                _FITS[0] += 1
                if _FITS[0] > 1:  # another fit in this process (a second model, the next fold): another loop
                    annotations.new_loop()
            if backend == "tensorflow":
                restore = self._begin_tf(kind)
            elif backend == "jax":
                restore = self._begin_jax(kind)
            elif backend == "torch":
                _tfdata_loop(True)  # a tf.data dataset fed to a torch-backend fit: no steps of its own
                last_end = self._last_step_end()  # read before forced_mode closes the tracker
                _torch_mode_begins(mode)
                if kind == "test" and self._in_fit():
                    self._boundary_begins(VALIDATION_START, last_end)
            self._loops.append((kind, restore))

        def _begin_jax(self, kind: str):
            """The step function timed (its fetch: GetNext); the note on what JAX does not give."""
            from stepscope.core import session
            from stepscope.integrations.keras import _jax_backend

            attr = {"train": "train_function", "test": "test_function", "predict": "predict_function"}[kind]
            function = getattr(self.model, attr, None)
            if kind == "train":
                session.add_note(_jax_backend.NOTE)
            _jax_backend.listen_to_compiles()
            if function is None or hasattr(function, "__stepscope_original__"):
                return None
            setattr(self.model, attr, _jax_backend._step_function(function, self))
            return attr, function

        def _begin_tf(self, kind: str):
            from stepscope.integrations import tfdata

            tfdata.keras_loop_begins()
            model = self.model
            restore = None
            attr = {"train": "train_function", "test": "test_function", "predict": "predict_function"}[kind]
            function = getattr(model, attr, None)
            strategy = _has_strategy(model)
            if function is not None and not hasattr(function, "__stepscope_original__"):
                in_python = getattr(model, "steps_per_execution", 1) == 1 and not strategy
                setattr(model, attr, _step_function(function, self, in_python))
                restore = (attr, function)
            if getattr(model, "steps_per_execution", 1) not in (1, None):
                from stepscope.core import session

                session.add_note("Keras steps_per_execution > 1: the batches are fetched inside the compiled "
                                 "loop; GetNext is sampled in profiler windows, not timed every step")
            elif kind == "train" and strategy:
                from stepscope.core import session

                session.add_note("Keras under a tf.distribute strategy: the batches are fetched inside the "
                                 "compiled step; GetNext is sampled in profiler windows, not timed every step")
            if kind != "train":
                from stepscope.core import session

                session.add_note("Keras evaluate/predict on TensorFlow: steps and GetNext are recorded; the "
                                 "Forward inside their compiled step is sampled in fit only")
            if kind == "train" and not getattr(model, "run_eagerly", False):
                from stepscope.core import session
                from stepscope.integrations.keras import _window

                current = session.current()
                self._sampler = _window.Sampler(model, current.config.steps if current else None)
            return restore

        def _end(self, kind: str) -> None:
            if self._off or not self._loops:
                return
            _, restore = self._loops.pop()
            if kind == "train":
                self._close_window()
                self._sampler = None
            self._end_step()
            backend = _backend(keras)
            if kind == "test" and self._in_fit() and backend in STEPPED_HERE:
                self._boundary_begins(EPOCH_END)
            elif kind == "train":
                end = now()
                self._boundary_ends(end)
                if self._fit_begin:
                    span(FRAMEWORK, intern(FIT), self._fit_begin, end)
                    self._fit_begin = 0
            if backend in STEPPED_HERE and restore is not None:
                attr, function = restore
                if getattr(getattr(self.model, attr, None), "__stepscope_original__", None) is function:
                    setattr(self.model, attr, function)
            if backend == "tensorflow":
                from stepscope.integrations import tfdata

                tfdata.keras_loop_ends()
            elif backend == "torch":
                last_end = self._last_step_end()
                _torch_mode_ends()
                _tfdata_loop(False)
                if kind == "test" and self._in_fit():
                    self._boundary_begins(EPOCH_END, last_end)

        def _end_step(self) -> int:
            """Ends the open step where its work ended; returns that tick."""
            end = now()
            if self._open:
                if self._step_begin < self._work_end < end:
                    end = self._work_end
                if self._execution is not None:  # the loop's last execution: as many steps as are left
                    steps = (self.params or {}).get("steps")
                    first = self._execution[1]
                    self._fill_execution(min(self._per_execution(), steps - first) if steps else 1, end)
                end_step(end)
                self._open = False
                self._last_end = end
            return end

        def _data_ended(self) -> None:
            """The open step's call met the end of the data (an epoch of unknown length):
            no step, its number the next one's; the call is named after the loop."""
            if self._open and self._execution is None:
                end = now()
                void_step(end)
                span(FRAMEWORK, intern(END_OF_DATA), self._step_begin, end)
                self._open = False
                self._last_end = self._step_begin  # where the loop's last step ended

        def _step_failed(self) -> None:
            """The open step's compiled call raised (not the data's end): a train step
            whose optimizer step never ran is flagged interrupted (SPEC §3), not counted."""
            if self._open and self._loops and self._loops[-1][0] == "train" and self._execution is None:
                interrupt_step(self._work_end)

        # --- between epochs ----------------------------------------------------------
        def _in_fit(self) -> bool:
            return bool(self._loops) and self._loops[-1][0] == "train"

        def _last_step_end(self) -> int:
            """Where the last closed step ended: ours on TensorFlow, the PyTorch step
            tracker's on torch (it closes a loop's last step where its work ended)."""
            if _backend(keras) == "torch":
                tracker = _torch_tracker()
                return int(getattr(tracker, "last_end", 0) or 0) if tracker is not None else 0
            return self._last_end

        def _boundary_begins(self, name: str, end: int = 0) -> None:
            end = end or self._last_step_end()
            if end:
                self._boundary = (name, end)

        def _boundary_ends(self, at: int) -> None:
            if self._boundary is not None:
                name, start = self._boundary
                self._boundary = None
                if at > start:
                    span(FRAMEWORK, intern(name), start, at)

        def _per_execution(self) -> int:
            try:
                return max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
            except (TypeError, ValueError):
                return 1

        def _fill_execution(self, count: int, end: int) -> None:
            """One callback batch ran ``count`` optimizer steps in one compiled call
            (steps_per_execution): the steps after its first share its time equally."""
            mode, first = self._execution
            self._execution = None
            window = self._sampler.window if self._sampler is not None and mode == "train" else None
            for k in range(1, count):
                at = self._step_begin + (end - self._step_begin) * k // count
                begin_step(mode, at)
                if window is not None:
                    window.step_begins.append(at)

        def _close_window(self) -> None:
            """The window's last step ends before the profiler is read: that cost
            lies between steps, as the `stepscope.profiler_window` annotation."""
            if self._sampler is not None and self._sampler.window is not None:
                self._sampler.close(self._end_step())

        def _step(self, kind: str, batch: int) -> None:
            if self._off or not self._loops:
                return
            t = now()
            self._boundary_ends(t)  # on torch the step began at its fetch, a little before: analysis clips
            if _backend(keras) == "torch":
                return  # on torch the PyTorch step tracker marks steps from its fetches
            sampler = self._sampler if kind == "train" else None
            if self._execution is not None:  # the previous callback batch ran this many steps
                self._fill_execution(batch - self._execution[1], t)
            if sampler is not None and sampler.window_ends_before(batch):
                self._close_window()
            number = begin_step(MODES[kind], t)
            self._open = True
            self._step_begin = t
            per_execution = self._per_execution()
            if per_execution > 1:
                self._execution = (MODES[kind], batch)
            if sampler is not None:
                sampler.after_step(number, batch, (self.params or {}).get("steps"), t, per_execution)

        # --- Keras hooks (each guarded: a failure turns stepscope off, never the job)
        @safety.guarded("the Keras callback failed")
        def on_train_begin(self, logs=None):
            self._begin("train")

        @safety.guarded("the Keras callback failed")
        def on_train_end(self, logs=None):
            self._end("train")

        @safety.guarded("the Keras callback failed")
        def on_test_begin(self, logs=None):
            self._begin("test")

        @safety.guarded("the Keras callback failed")
        def on_test_end(self, logs=None):
            self._end("test")

        @safety.guarded("the Keras callback failed")
        def on_predict_begin(self, logs=None):
            self._begin("predict")

        @safety.guarded("the Keras callback failed")
        def on_predict_end(self, logs=None):
            self._end("predict")

        @safety.guarded("the Keras callback failed")
        def on_epoch_end(self, epoch, logs=None):
            self._close_window()
            self._end_step()
            if self._boundary is None and self._in_fit():
                self._boundary_begins(EPOCH_END)

        @safety.guarded("the Keras callback failed")
        def on_train_batch_begin(self, batch, logs=None):
            self._step("train", batch)

        @safety.guarded("the Keras callback failed")
        def on_test_batch_begin(self, batch, logs=None):
            self._step("test", batch)

        @safety.guarded("the Keras callback failed")
        def on_predict_batch_begin(self, batch, logs=None):
            self._step("predict", batch)

    return StepscopeCallback


def _tfdata_loop(begins: bool) -> None:
    if "tensorflow" not in sys.modules:
        return
    from stepscope.integrations import tfdata

    (tfdata.keras_loop_begins if begins else tfdata.keras_loop_ends)()


def _callback_class():
    import keras

    return _build_class(keras)
