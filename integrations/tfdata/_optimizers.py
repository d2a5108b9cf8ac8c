"""Optimizers applied in a custom TensorFlow loop (issue 81): where a train step is when
no tf.data fetch drives the loop (batches from a Python generator, a list, NumPy slices).

Wrapped: a Keras 3 optimizer's ``apply`` (behind ``apply_gradients``; ``tf.keras.optimizers``
is Keras 3 from TensorFlow 2.16 on; the Keras integration patches it on the TensorFlow
backend), and TensorFlow's v1 ``Optimizer.apply_gradients`` (``tf.compat.v1.train``). Each
call tells the tf.data instrumentor (``optimizer_applied``):

* run eagerly, it is the step's Optimizer phase;
* traced inside a ``tf.function`` (plain or ``jit_compile=True``), it marks the functions
  being traced as ones that apply gradients: each eager call of the outermost one is then
  one train step (``Modes.applying``).

An apply inside another (a LossScaleOptimizer's inner optimizer) is part of the outer one.
"""

from __future__ import annotations

import threading

from stepscope.core.recording import now
from stepscope.integrations._frameless import frameless


def wrapper(instrumentor, executing_eagerly):
    """A patch's ``make_wrapper`` for an optimizer's apply method: frameless (an error in the
    user's gradients keeps its traceback as without stepscope)."""
    inside = threading.local()

    def make(original):
        def before(optimizer, *args, **kwargs):
            if getattr(inside, "on", False) or not instrumentor.is_instrumented():
                return None
            inside.on = True
            return (optimizer, *args), kwargs, (optimizer, now(), executing_eagerly())

        def after(token, exc):
            inside.on = False
            if exc is None:
                optimizer, t0, eager = token
                instrumentor.optimizer_applied(optimizer, t0, now(), eager)

        return frameless(original, before, after, "the tf.data integration failed")

    return make


def patch_tf_v1(instrumentor, executing_eagerly) -> None:
    """TensorFlow's own v1 optimizers (``tf.compat.v1.train.*Optimizer``)."""
    try:
        from tensorflow.python.training import optimizer as v1
    except ImportError:  # another TensorFlow: its v1 optimizers' steps are not seen
        return
    if callable(getattr(getattr(v1, "Optimizer", None), "apply_gradients", None)):
        instrumentor.patch(v1.Optimizer, "apply_gradients", wrapper(instrumentor, executing_eagerly))
