"""The Keras zero-edit instrumentor (the integration contract of ``integrations._base``).

* ``backend_hooks`` (``_backend_hooks.py``): what the callback needs beside itself.
* ``instrumentor``: zero-edit mode; adds the callback to every
  ``fit``/``evaluate``/``predict`` (and turns on ``backend_hooks``), and makes
  each ``train_on_batch``/``test_on_batch``/``predict_on_batch`` a step.
"""

from __future__ import annotations

import inspect
import sys

from stepscope.core import safety
from stepscope.integrations._base import Instrumentor
from stepscope.integrations._frameless import frameless
from stepscope.integrations.keras import _callback
from stepscope.integrations.keras._backend_hooks import backend_hooks
from stepscope.integrations.keras._callback import _callback_class
from stepscope.integrations.keras._tf_backend import torch_loaders_read_through_tfdata


class KerasInstrumentor(Instrumentor):
    name = "Keras"
    module = "keras"
    distribution = "keras"
    supported = ">=3,<4"

    def _instrument(self) -> None:
        import keras

        if not backend_hooks.ensure():
            raise RuntimeError("the Keras backend hooks could not be installed")
        for name in ("fit", "evaluate", "predict"):
            self.patch(keras.Model, name, _with_callback)
        from stepscope.integrations.keras import _on_batch

        for name in _on_batch.MODES:
            self.patch(keras.Model, name, _on_batch.wrap(name))

    def on_import(self, module) -> None:
        if "keras" in sys.modules:
            self.ensure()


instrumentor = KerasInstrumentor()


def _has_ours(callbacks) -> bool:
    classes = _callback._build_class.made()
    items = getattr(callbacks, "callbacks", callbacks) or []
    return bool(classes) and any(isinstance(cb, classes) for cb in items)


def _on_tensorflow() -> bool:
    try:
        return sys.modules["keras"].backend.backend() == "tensorflow"
    except Exception:  # noqa: BLE001
        return False


def _with_callback(method):
    """fit/evaluate/predict with our callback added to `callbacks` (keyword or positional).

    A C wrapper (``frameless``): an error raised inside keeps the traceback the
    plain run shows, Keras's own filtering included."""
    index = list(inspect.signature(method).parameters).index("callbacks")  # self included

    def before(*args, **kwargs):
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
        reads = None
        if _on_tensorflow():
            reads = torch_loaders_read_through_tfdata()
            reads.__enter__()
        return args, kwargs, reads

    def after(reads, exc):
        if reads is not None:
            reads.__exit__(None, None, None)

    return frameless(method, before, after, "adding the Keras callback failed")
