"""Keras on TensorFlow: the batch fetched in Python (GetNext on every step),
and the yield to TensorBoard's profiler."""

from __future__ import annotations

import contextlib
import functools
import sys

from stepscope.core import _native, safety


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


def _has_strategy(model) -> bool:
    """Whether the model trains under a tf.distribute strategy: the one it was built
    in (Keras keeps it; fit runs outside its scope), or a scope fit runs in."""
    import tensorflow as tf

    return getattr(model, "_distribute_strategy", None) is not None or tf.distribute.has_strategy()


def _symbolic_build_fetches_not_steps(original):
    """Under a tf.distribute strategy Keras fetches a batch eagerly to build the
    model, before a loop's callbacks run (``_maybe_symbolic_build``): no step of
    tf.data's custom-loop tracking."""
    from stepscope.integrations import tfdata

    @functools.wraps(original)
    def build(*args, **kwargs):
        with tfdata.keras_loop():
            return original(*args, **kwargs)

    build.__stepscope_original__ = original
    return build


@contextlib.contextmanager
def torch_loaders_read_through_tfdata():
    """A torch DataLoader fed to fit/evaluate/predict on TensorFlow: Keras reads it
    through tf.data (``from_generator``), whose fetch is the step's GetNext, and peeks
    at its first batches for their shapes before a loop's callbacks run. The loader's
    own reads are no steps of the PyTorch integration (its ``hidden()``)."""
    st_torch = sys.modules.get("stepscope.integrations.torch")  # never imported here: torch may be absent
    if st_torch is None:
        yield
        return
    with st_torch.hidden():  # does nothing while torch is not instrumented
        yield


def _yield_to_user_profiler(original):
    """TensorBoard(profile_batch=...) starts TF's profiler: close our window first."""

    @functools.wraps(original)
    def start_trace(*args, **kwargs):
        try:
            from stepscope.integrations.keras import _window  # noqa: F811

            for sampler in _window.Sampler.live():
                sampler.abandon()
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("yielding to TensorBoard's profiler failed", exc)
        return original(*args, **kwargs)

    start_trace.__stepscope_original__ = original
    return start_trace
