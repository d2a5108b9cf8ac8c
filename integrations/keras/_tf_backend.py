"""Keras on TensorFlow: the batch fetched in Python (GetNext on every step),
and the yield to TensorBoard's profiler."""

from __future__ import annotations

import contextlib
import itertools
import sys

from stepscope.core import safety
from stepscope.core.recording import now
from stepscope.integrations._frameless import frameless


class _EndOfData:
    """After the last batch of a tf.data iterator fetched in Python: TF's
    end-of-data error, which Keras's epoch loop catches (as in-graph)."""

    __slots__ = ("out_of_range",)

    def __init__(self, out_of_range):
        self.out_of_range = out_of_range

    def __iter__(self):
        return self

    def __next__(self):
        raise self.out_of_range(None, None, "End of sequence")


def _step_function(function, callback, fetch_in_python: bool):
    """Keras's step function, timed: it tells the callback where each step's work ended
    (a loop's last step ends there, not after the epoch's bookkeeping) and which call met
    the end of the data (that call's time lies after the loop, SPEC §3). With
    ``fetch_in_python``, one eager fetch per step, timed by the tf.data integration.

    Frameless, and the batches come through ``itertools.chain`` (C): an error in
    the step or in the dataset shows no stepscope frame."""
    import tensorflow as tf
    from tensorflow.python.data.ops import iterator_ops

    owned, out_of_range = iterator_ops.OwnedIterator, tf.errors.OutOfRangeError

    def before(iterator, *rest):
        if fetch_in_python and type(iterator) is owned:
            iterator = itertools.chain(iterator, _EndOfData(out_of_range))
        return (iterator, *rest), None, callback

    def after(callback, exc):
        if exc is None:
            callback._work_end = now()
        elif isinstance(exc, (out_of_range, StopIteration)):  # the data's end: the call belongs to no step
            callback._data_ended()
        else:
            callback._work_end = now()
            callback._step_failed()

    return frameless(function, before, after, "the Keras integration failed")


def _new_optimizer_new_loop(original):
    """A Keras optimizer made after a custom loop's steps begins another loop (the next
    model, fold or trial: SPEC §3), as a torch optimizer does; a fit marks its own."""
    def after(token, exc):
        if exc is None:
            from stepscope.integrations import tfdata

            tfdata.instrumentor.new_loop()

    return frameless(original, lambda *args, **kwargs: (args, kwargs, None), after,
                     "the Keras integration failed")


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

    def before(*args, **kwargs):
        tfdata.keras_loop_begins()
        return args, kwargs, None

    def after(token, exc):
        tfdata.keras_loop_ends()

    return frameless(original, before, after, "the Keras integration failed")


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

    def before(*args, **kwargs):
        try:
            from stepscope.integrations.keras import _window

            for sampler in _window.Sampler.live():
                sampler.abandon()
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("yielding to TensorBoard's profiler failed", exc)
        return None

    return frameless(original, before, None, "yielding to TensorBoard's profiler failed")
