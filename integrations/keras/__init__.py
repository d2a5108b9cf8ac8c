"""Keras 3: one callback, or none under STEPSCOPE=1.

    model.fit(..., callbacks=[stepscope.integrations.keras.StepscopeCallback()])

Under ``STEPSCOPE=1`` the callback is added to every ``fit``/``evaluate``/
``predict`` (``keras.Model``'s methods are wrapped right after ``import keras``).
Importing this module does not import Keras; the callback class is built on
first use.

Steps come from the batch hooks (``on_{train,test,predict}_batch_begin``):
modes train/eval/predict, contiguous, numbered from 0 per mode; a loop's last
step ends with its loop. The callback overrides no batch-*end* hook and sets
``async_safe = True``, so Keras keeps dispatching those asynchronously.

TensorFlow backend (compiled ``train_step``, ``jit_compile`` on or off):

* GetNext: with ``steps_per_execution == 1`` (the default) and no
  distribution strategy, Keras's compiled step is handed a batch fetched in
  Python instead of fetching in-graph (``model.train_function`` /
  ``test_function`` are wrapped for the loop's duration; the compiled
  ``one_step_on_data`` is unchanged), and the tf.data integration times that
  fetch on every step. ``predict`` fetches in Python already. Otherwise
  GetNext comes from the sampled profiler window (``IteratorGetNextOp``).
* Forward/Loss/Backward/Optimizer: from sampled ``tf.profiler`` windows, see
  ``_window`` for the sampling policy and what shares of unsampled steps mean.

Torch backend: Keras layers are ``torch.nn.Module``s, so the PyTorch
integration's hooks give Forward/Backward and the DataLoader's GetNext; this
module adds the Keras optimizer (``keras.optimizers.Optimizer.apply``) as
Optimizer and tells the PyTorch step tracker each loop's mode.
"""

from __future__ import annotations

import functools
import inspect
import sys

from stepscope.core import _native, safety

__all__ = ["StepscopeCallback", "instrument", "uninstrument", "is_instrumented"]

KNOWN_KERAS_MAJOR = 3
MODES = {"train": "train", "test": "eval", "predict": "predict"}
_class = None
_patches: list = []  # (owner, attribute, original or None when it was inherited)
_state = {"instrumented": False, "backend_hooked": False, "supported": None}


# --- versions -------------------------------------------------------------------------
def _supported(keras) -> bool:
    """Keras 3 only; anything else: one line, this integration off, training unchanged."""
    if _state["supported"] is None:
        version = getattr(keras, "__version__", "?")
        ok = version.split(".")[0] == str(KNOWN_KERAS_MAJOR)
        if not ok:
            safety.warn_once("keras", f"stepscope: Keras {version} is not supported (Keras 3 is); "
                                      "Keras is not profiled, the program continues unaffected")
        _state["supported"] = ok
    return _state["supported"]


def _backend(keras) -> str:
    return keras.backend.backend()


# --- the Python-side fetch (TensorFlow backend) ----------------------------------------
class _PythonFetch:
    """Stands for a tf.data iterator in Keras's step function: one eager fetch
    per step (timed by the tf.data integration), its end as TF's end-of-data."""

    __slots__ = ("iterator", "out_of_range")

    def __init__(self, iterator, out_of_range):
        self.iterator = iterator
        self.out_of_range = out_of_range

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.iterator)
        except StopIteration:
            raise self.out_of_range(None, None, "End of sequence") from None


def _fetching_in_python(function, callback):
    """Keras's step function fed from Python; it also tells the callback where
    each step's work ended (a loop's last step ends there, not after the
    epoch's bookkeeping)."""
    import tensorflow as tf
    from tensorflow.python.data.ops import iterator_ops

    owned = iterator_ops.OwnedIterator

    @functools.wraps(function)
    def step_function(iterator):
        try:
            if type(iterator) is owned:
                return function(_PythonFetch(iterator, tf.errors.OutOfRangeError))
            return function(iterator)
        finally:
            callback._work_end = _native.now()

    step_function.__stepscope_original__ = function
    return step_function


# --- the callback ---------------------------------------------------------------------
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
            self._work_end = 0  # tick: end of the open step's compiled call, when known
            self._sampler = None
            self._off = False
            try:
                _hook_backend()  # before fit: its first batch may run before on_train_begin
            except Exception as exc:  # noqa: BLE001
                safety.report_failure("the Keras integration failed", exc)

        # --- loops ---------------------------------------------------------------
        def _begin(self, kind: str) -> None:
            if self._off:
                return
            if not _supported(keras):
                self._off = True
                return
            import stepscope

            if stepscope.current() is None:
                stepscope.start(**self._start_kwargs)
            if not _hook_backend():
                self._off = True
                return
            mode = MODES[kind]
            self._close_window()
            self._end_step()
            restore = None
            backend = _backend(keras)
            if backend == "tensorflow":
                restore = self._begin_tf(kind)
            elif backend == "torch":
                _torch_mode_begins(mode)
            self._loops.append((kind, restore))

        def _begin_tf(self, kind: str):
            from stepscope.integrations import tfdata

            tfdata.keras_loop_begins()
            model = self.model
            restore = None
            attr = {"train": "train_function", "test": "test_function"}.get(kind)
            function = getattr(model, attr, None) if attr else None
            if (function is not None and getattr(model, "steps_per_execution", 1) == 1
                    and not _has_strategy() and not hasattr(function, "__stepscope_original__")):
                setattr(model, attr, _fetching_in_python(function, self))
                restore = (attr, function)
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
            if backend == "tensorflow":
                from stepscope.integrations import tfdata

                if restore is not None:
                    attr, function = restore
                    if getattr(getattr(self.model, attr, None), "__stepscope_original__", None) is function:
                        setattr(self.model, attr, function)
                tfdata.keras_loop_ends()
            elif backend == "torch":
                _torch_mode_ends()

        def _end_step(self) -> int:
            """Ends the open step where its work ended; returns that tick."""
            end = _native.now()
            if self._open:
                if self._step_begin < self._work_end < end:
                    end = self._work_end
                _native.end_step(end)
                self._open = False
            return end

        def _close_window(self) -> None:
            """The window's last step ends before the profiler is read: that cost
            lies between steps, as the `stepscope.profiler_window` annotation."""
            if self._sampler is not None and self._sampler.window is not None:
                self._sampler.close(self._end_step())

        def _step(self, kind: str, batch: int) -> None:
            if self._off or not self._loops or _backend(keras) == "torch":
                return  # on torch the PyTorch step tracker marks steps from its fetches
            sampler = self._sampler if kind == "train" else None
            if sampler is not None and sampler.window_ends_before(batch):
                self._close_window()
            t = _native.now()
            number = _native.begin_step(MODES[kind], t)
            self._open = True
            self._step_begin = t
            if sampler is not None:
                sampler.after_step(number, batch, (self.params or {}).get("steps"), t)

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

        @safety.guarded("the Keras callback failed")
        def on_train_batch_begin(self, batch, logs=None):
            self._step("train", batch)

        @safety.guarded("the Keras callback failed")
        def on_test_batch_begin(self, batch, logs=None):
            self._step("test", batch)

        @safety.guarded("the Keras callback failed")
        def on_predict_batch_begin(self, batch, logs=None):
            self._step("predict", batch)

    StepscopeCallback.__module__ = __name__
    return StepscopeCallback


def _callback_class():
    global _class
    if _class is None:
        import keras

        _class = _build_class(keras)
    return _class


def __getattr__(name):  # the class is built (and Keras imported) on first use
    if name == "StepscopeCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _has_strategy() -> bool:
    import tensorflow as tf

    return tf.distribute.has_strategy()


# --- torch backend --------------------------------------------------------------------
def _torch_tracker():
    from stepscope.integrations import torch as st_torch

    return st_torch.step_tracker()


def _torch_mode_begins(mode: str) -> None:
    from stepscope.integrations import torch as st_torch

    cm = st_torch.forced_mode(mode)
    cm.__enter__()
    _forced.append(cm)


def _torch_mode_ends() -> None:
    if _forced:
        _forced.pop().__exit__(None, None, None)


_forced: list = []  # the open forced_mode contexts of nested fit/evaluate/predict


def _hidden_from_torch(original):
    """Keras's symbolic passes (building a model on KerasTensors, on a first
    batch before a loop's callbacks run) call the torch modules too: they are
    no steps and no phases (the torch integration's ``hidden()``)."""
    from stepscope.integrations import torch as st_torch

    @functools.wraps(original)
    def symbolic(*args, **kwargs):
        with st_torch.hidden():
            return original(*args, **kwargs)

    symbolic.__stepscope_original__ = original
    return symbolic


def _symbolic_calls_hidden_from_torch(original):
    """A Keras layer called on KerasTensors (building a model) passes through
    ``nn.Module.__call__`` too; only outermost calls are checked."""
    from keras.src.backend.common.keras_tensor import any_symbolic_tensors

    from stepscope.integrations import torch as st_torch

    hidden = _hidden_from_torch(original)

    @functools.wraps(original)
    def __call__(layer, *args, **kwargs):
        if st_torch.is_hidden() or not any_symbolic_tensors(args, kwargs):
            return original(layer, *args, **kwargs)
        return hidden(layer, *args, **kwargs)

    __call__.__stepscope_original__ = original
    return __call__


def _wrap_optimizer_apply(original):
    """Keras's optimizer on the torch backend: Optimizer, counted once (apply_gradients calls apply)."""
    depth = [0]

    @functools.wraps(original)
    def apply(optimizer, *args, **kwargs):
        tracker = _torch_tracker() if depth[0] == 0 else None
        t0 = _native.now()
        depth[0] += 1
        try:
            if tracker is not None:
                tracker.optimizer_started(id(optimizer), t0)
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("the Keras optimizer hook failed", exc)
            tracker = None
        try:
            return original(optimizer, *args, **kwargs)
        finally:
            depth[0] -= 1
            if tracker is not None:
                try:
                    tracker.optimizer_ended(id(optimizer), t0, _native.now())
                except Exception as exc:  # noqa: BLE001
                    safety.report_failure("the Keras optimizer hook failed", exc)

    apply.__stepscope_original__ = original
    return apply


# --- zero-edit injection ----------------------------------------------------------------
def _has_ours(callbacks) -> bool:
    cls = _class
    items = getattr(callbacks, "callbacks", callbacks) or []
    return cls is not None and any(isinstance(cb, cls) for cb in items)


def _with_callback(method):
    """fit/evaluate/predict with our callback added to `callbacks` (keyword or positional)."""
    index = list(inspect.signature(method).parameters).index("callbacks") - 1  # without self

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            if index < len(args):
                callbacks = args[index]
                if not _has_ours(callbacks) and not hasattr(callbacks, "callbacks"):
                    args = (*args[:index], [*(callbacks or []), _callback_class()()], *args[index + 1:])
            else:
                callbacks = kwargs.get("callbacks")
                if not _has_ours(callbacks) and not hasattr(callbacks, "callbacks"):
                    kwargs["callbacks"] = [*(callbacks or []), _callback_class()()]
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("adding the Keras callback failed", exc)
        return method(self, *args, **kwargs)

    wrapper.__stepscope_original__ = method
    return wrapper


def _patch(owner, name, make_wrapper) -> None:
    inherited = name not in owner.__dict__
    original = getattr(owner, name)
    if hasattr(original, "__stepscope_original__"):
        return
    setattr(owner, name, make_wrapper(original))
    _patches.append((owner, name, None if inherited else original))


def _yield_to_user_profiler(original):
    """TensorBoard(profile_batch=...) starts TF's profiler: close our window first."""

    @functools.wraps(original)
    def start_trace(*args, **kwargs):
        try:
            from stepscope.integrations.keras import _window

            for sampler in _window.Sampler.live():
                sampler.abandon()
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("yielding to TensorBoard's profiler failed", exc)
        return original(*args, **kwargs)

    start_trace.__stepscope_original__ = original
    return start_trace


def _hook_backend() -> bool:
    """What the callback needs beside itself: tf.data fetches and the yield to
    TensorBoard's profiler (TF), the Keras optimizer and symbolic passes (torch)."""
    if _state["backend_hooked"]:
        return True
    import keras

    if not _supported(keras):
        return False
    try:
        backend = _backend(keras)
        if backend == "tensorflow":
            from stepscope.integrations import tfdata

            tfdata.instrumentor.ensure()
            from keras.src.backend.tensorflow import tensorboard

            _patch(tensorboard, "start_trace", _yield_to_user_profiler)
        elif backend == "torch":
            _patch(keras.optimizers.Optimizer, "apply", _wrap_optimizer_apply)
            _patch(keras.Model, "_symbolic_build", _hidden_from_torch)
            _patch(keras.Layer, "__call__", _symbolic_calls_hidden_from_torch)
    except Exception as exc:  # noqa: BLE001 - an unknown Keras layout: this integration stays off
        _unsupported_layout(keras, exc)
        return False
    _state["backend_hooked"] = True
    return True


def _unsupported_layout(keras, exc) -> None:
    uninstrument()
    safety.warn_once("keras", f"stepscope: cannot instrument Keras {keras.__version__} "
                              f"({type(exc).__name__}: {exc}); Keras is not profiled, "
                              "the program continues unaffected")
    _state["supported"] = False


def instrument() -> bool:
    """Zero-edit mode: adds the callback to every fit/evaluate/predict. Idempotent.

    Returns False (after one stderr line) for a Keras version this does not know.
    """
    if _state["instrumented"]:
        return True
    if not _hook_backend():
        return False
    import keras

    try:
        for name in ("fit", "evaluate", "predict"):
            _patch(keras.Model, name, _with_callback)
    except Exception as exc:  # noqa: BLE001
        _unsupported_layout(keras, exc)
        return False
    _state["instrumented"] = True
    return True


def _unpatch() -> None:
    while _patches:
        owner, name, original = _patches.pop()
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


def uninstrument() -> None:
    """Removes every patch this integration installed (callbacks already passed to Keras stay)."""
    _unpatch()
    if _state["backend_hooked"]:
        from stepscope.integrations import tfdata

        tfdata.uninstrument()
    _state["instrumented"] = _state["backend_hooked"] = False


def is_instrumented() -> bool:
    return _state["instrumented"]


class _KerasEntry:
    """The entry point zero-edit start loads (``stepscope_instrumentor``)."""

    @staticmethod
    def on_import(keras_module) -> None:
        if "keras" in sys.modules:
            instrument()


instrumentor = _KerasEntry()
