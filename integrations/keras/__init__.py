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
  GetNext comes from the sampled profiler window (``IteratorGetNextOp``, or
  ``IteratorGetNextAsOptionalOp`` for a strategy's iterator), and a
  run.json note says so.
* Forward/Loss/Backward/Optimizer: from sampled ``tf.profiler`` windows, see
  ``_window`` for the sampling policy and what shares of unsampled steps mean.

Torch backend: Keras layers are ``torch.nn.Module``s, so the PyTorch
integration's hooks give Forward/Backward and the DataLoader's GetNext; this
adds the Keras optimizer (``keras.optimizers.Optimizer.apply``) as Optimizer
and tells the PyTorch step tracker each loop's mode.

Modules: ``_callback`` (the callback), ``_tf_backend``, ``_torch_backend``,
``_instrumentors`` (zero-edit patching and backend hooks), ``_window`` and
``_xspace`` (the sampled TensorFlow profiler windows).
"""

from __future__ import annotations

from stepscope.integrations.keras._backend_hooks import backend_hooks
from stepscope.integrations.keras._instrumentors import instrumentor

__all__ = ["StepscopeCallback", "instrument", "uninstrument", "is_instrumented", "instrumentor"]


def __getattr__(name):  # the class is built (and Keras imported) on first use
    if name == "StepscopeCallback":
        from stepscope.integrations.keras._callback import _callback_class

        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def instrument() -> bool:
    """Zero-edit mode: adds the callback to every fit/evaluate/predict.

    Returns False (after one stderr line) for a Keras version this does not know.
    """
    return instrumentor.instrument(stacklevel=3)


def uninstrument() -> None:
    """Removes every patch this integration installed (callbacks already passed to Keras stay)."""
    instrumentor.uninstrument()
    backend_hooks.uninstrument()


def is_instrumented() -> bool:
    return instrumentor.is_instrumented()
