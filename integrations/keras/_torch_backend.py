"""Keras on torch: Keras layers are ``torch.nn.Module``s, so the PyTorch
integration gives Forward/Backward/GetNext; this adds the Keras optimizer as
Optimizer, each loop's mode, and hides Keras's symbolic passes (through the
torch integration's public seams only)."""

from __future__ import annotations

import contextlib
import sys

from stepscope.core import safety
from stepscope.core.recording import now
from stepscope.integrations._frameless import frameless


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

    def before(*args, **kwargs):
        return args, kwargs, _entered_hidden()

    return frameless(original, before, _exit_hidden, "the Keras integration failed")


def _entered_hidden() -> contextlib.ExitStack:
    from stepscope.integrations import torch as st_torch

    stack = contextlib.ExitStack()
    stack.enter_context(st_torch.hidden())
    stack.enter_context(_tfdata_fetches_not_steps())
    return stack


def _exit_hidden(stack, exc) -> None:
    stack.close()


@contextlib.contextmanager
def _tfdata_fetches_not_steps():
    """A tf.data dataset fed to a torch-backend fit: the batch Keras fetches to
    build the model (before the loop's callbacks) is no step of tf.data's."""
    tfdata = sys.modules.get("stepscope.integrations.tfdata") if "tensorflow" in sys.modules else None
    if tfdata is None or not tfdata.is_instrumented():
        yield
        return
    with tfdata.keras_loop():
        yield


def _symbolic_calls_hidden_from_torch(original):
    """A Keras layer called on KerasTensors (building a model) passes through
    ``nn.Module.__call__`` too; only outermost calls are checked."""
    from keras.src.backend.common.keras_tensor import any_symbolic_tensors

    from stepscope.integrations import torch as st_torch

    def before(layer, *args, **kwargs):
        if st_torch.is_hidden() or not any_symbolic_tensors(args, kwargs):
            return None
        return (layer, *args), kwargs, _entered_hidden()

    return frameless(original, before, _exit_hidden, "the Keras integration failed")


def _wrap_optimizer_apply(original):
    """Keras's optimizer on the torch backend: Optimizer, counted once (apply_gradients calls apply)."""
    depth = [0]

    def before(optimizer, *args, **kwargs):
        tracker = _torch_tracker() if depth[0] == 0 else None
        t0 = now()
        depth[0] += 1
        try:
            if tracker is not None:
                tracker.optimizer_started(id(optimizer), t0)
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("the Keras optimizer hook failed", exc)
            tracker = None
        return (optimizer, *args), kwargs, (tracker, id(optimizer), t0)

    def after(token, exc):
        tracker, key, t0 = token
        depth[0] -= 1
        if tracker is not None:
            tracker.optimizer_ended(key, t0, now())

    return frameless(original, before, after, "the Keras optimizer hook failed")
