"""``train_on_batch`` / ``test_on_batch`` / ``predict_on_batch``: loops written by
hand (GAN and RL code), with no fit and so no callbacks.

Each call is one step of its mode, from the call's start to the next call's (a
step left open at the end runs to where its last call returned). On the torch
backend the PyTorch integration's hooks give the phases inside, in the call's
mode. On TensorFlow the compiled step is not sampled: the step and a
``keras.<method>`` framework span are recorded, and run.json says so.
"""

from __future__ import annotations

from stepscope.core import safety, session
from stepscope.core.recording import FRAMEWORK, begin_step, end_step, intern, now, span
from stepscope.integrations._frameless import frameless

MODES = {"train_on_batch": "train", "test_on_batch": "eval", "predict_on_batch": "predict"}
_open = {"step": False, "last_end": 0}
_noted: set = set()


def wrap(method_name: str):
    """A frameless wrapper (``integrations._frameless``): errors inside keep their traceback."""
    mode = MODES[method_name]
    span_name = intern(f"keras.{method_name}")

    def before(*args, **kwargs):
        import keras

        if keras.backend.backend() == "torch":
            from stepscope.integrations import torch as st_torch

            forced = st_torch.forced_mode(mode)
            forced.__enter__()
            return args, kwargs, forced
        from stepscope.integrations import tfdata

        tfdata.instrumentor.keras_calls += 1  # the call's own step function and optimizer make no step there
        t0 = now()
        try:
            begin_step(mode, t0)
            _open["step"] = True
            if method_name not in _noted:
                _noted.add(method_name)
                session.on_stop(_close)
                session.add_note(f"Keras {method_name} on TensorFlow: one step per call; the phases inside "
                                 "its compiled step are not sampled")
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("the Keras integration failed", exc)
        return args, kwargs, t0

    def after(token, exc):
        if not isinstance(token, int):
            token.__exit__(None, None, None)
            return
        from stepscope.integrations import tfdata

        tfdata.instrumentor.keras_calls -= 1
        t1 = now()
        span(FRAMEWORK, span_name, token, t1)
        _open["last_end"] = t1

    return lambda original: frameless(original, before, after, "the Keras integration failed")


def _close() -> None:
    if _open["step"]:
        _open["step"] = False
        end_step(_open["last_end"])
