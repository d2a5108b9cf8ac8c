"""Hugging Face Transformers: the ``Trainer``, with one callback or none.

    Trainer(..., callbacks=[stepscope.integrations.transformers.StepscopeCallback()])

Under ``STEPSCOPE=1`` every ``Trainer`` gets the callback (``Trainer.__init__``
is wrapped right after ``transformers.trainer`` is imported: never earlier, so a
job that only tokenizes imports nothing more). The phases come from the
PyTorch integration: the Trainer is a PyTorch loop, and Accelerate's wrapped
DataLoader (``DataLoaderShard``, a ``DataLoader``) and optimizer
(``AcceleratedOptimizer``, which steps the real optimizer only on a
synchronising micro-batch) go through the same hooks. One train step is one
optimizer step: the Trainer reads a whole gradient-accumulation window's
batches before working on them (``get_batch_samples``), and the step tracker
counts read-ahead batches as the GetNext of the step that uses them.

The callback starts a session if none runs (keywords as for
``stepscope.start``); it records until ``stepscope.stop()`` or the end of the
process, so an ``evaluate()`` after ``train()`` is recorded too.
"""

from __future__ import annotations

from stepscope.core import safety
from stepscope.integrations._base import Instrumentor
from stepscope.integrations._late_class import late_class

__all__ = ["StepscopeCallback", "instrument", "uninstrument", "is_instrumented", "instrumentor"]


@late_class(__name__, "StepscopeCallback")
def _build_class(transformers):
    class StepscopeCallback(transformers.TrainerCallback):
        """Profiles ``Trainer.train()`` (and the evaluations inside it)."""

        def __init__(self, **start_kwargs):
            self._start_kwargs = start_kwargs
            self._started = None
            if not instrumentor.is_instrumented():
                _modes.ensure()

        @safety.guarded("the Transformers callback failed")
        def on_train_begin(self, args, state, control, **kwargs):
            from stepscope.core import session
            from stepscope.integrations import torch as st_torch

            st_torch.step_tracker()  # instruments torch if it is not yet
            if session.current() is None:
                self._started = session.start(**self._start_kwargs)

    return StepscopeCallback


def _callback_class():
    import transformers

    return _build_class(transformers)


def __getattr__(name):  # built (and transformers imported) on first use
    if name == "StepscopeCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TransformersInstrumentor(Instrumentor):
    """``Trainer.train``/``evaluate``/``predict`` run in their mode (the Trainer
    calls ``model.train()`` only after fetching a step's batches), Accelerate's
    loaders are timed as the loop sees them; in zero-edit mode (``adds``) every
    ``Trainer`` gets the callback."""

    name = "transformers"
    module = "transformers"
    distribution = "transformers"
    supported = ">=4.30"

    def __init__(self, adds: bool):
        super().__init__()
        self.adds = adds

    def _instrument(self) -> None:
        from transformers import trainer

        from stepscope.integrations import accelerate

        accelerate.instrumentor.ensure()
        if self.adds:
            self.patch(trainer.Trainer, "__init__", _adding_callback)
        for method, mode in (("train", "train"), ("evaluate", "eval"), ("predict", "predict")):
            self.patch(trainer.Trainer, method, lambda original, mode=mode: _in_mode(original, mode))


def _in_mode(original, mode: str):
    def method(self, *args, **kwargs):
        from stepscope.integrations import torch as st_torch

        with st_torch.forced_mode(mode):
            return original(self, *args, **kwargs)

    return method


def _adding_callback(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            cls = _callback_class()
            if not any(isinstance(cb, cls) for cb in self.callback_handler.callbacks):
                self.add_callback(cls())
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("adding the Transformers callback failed", exc)

    return __init__


instrumentor = TransformersInstrumentor(adds=True)  # zero-edit mode
_modes = TransformersInstrumentor(adds=False)  # turned on by the first StepscopeCallback()


def instrument() -> bool:
    """Adds the callback to every Trainer created from now on (zero-edit mode)."""
    return instrumentor.instrument(stacklevel=3)


def uninstrument() -> None:
    instrumentor.uninstrument()


def is_instrumented() -> bool:
    return instrumentor.is_instrumented()
