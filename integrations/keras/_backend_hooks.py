"""What the Keras callback needs beside itself (an instrumentor of ``integrations._base``):
tf.data fetches, the optimizer's apply (a custom loop's steps) and the yield to
TensorBoard's profiler on TensorFlow; the Keras
optimizer and symbolic passes on torch. The callback turns it on (and zero-edit
mode, through ``_instrumentors.py``)."""

from __future__ import annotations

from stepscope.integrations._base import Instrumentor


class KerasBackendHooks(Instrumentor):
    name = "Keras"
    module = "keras"
    distribution = "keras"
    supported = ">=3,<4"

    def _instrument(self) -> None:
        import keras

        backend = keras.backend.backend()
        if backend == "tensorflow":
            from keras.src.backend.tensorflow import tensorboard, trainer

            from stepscope.integrations import tfdata
            from stepscope.integrations.keras import _tf_backend as tb

            from tensorflow.python.eager import context

            tfdata.instrumentor.ensure()
            self.patch(tensorboard, "start_trace", tb._yield_to_user_profiler)
            # a custom loop's steps where no tf.data fetch drives it (issue 81)
            self.patch(keras.optimizers.Optimizer, "apply", tfdata.optimizer_apply_wrapper(context.executing_eagerly))
            self.patch(keras.optimizers.Optimizer, "__init__", tb._new_optimizer_new_loop)
            if hasattr(trainer.TensorFlowTrainer, "_maybe_symbolic_build"):  # where this Keras has it
                self.patch(trainer.TensorFlowTrainer, "_maybe_symbolic_build", tb._symbolic_build_fetches_not_steps)
        elif backend == "torch":
            from stepscope.integrations.keras import _torch_backend as tb

            self.patch(keras.optimizers.Optimizer, "apply", tb._wrap_optimizer_apply)
            self.patch(keras.Model, "_symbolic_build", tb._hidden_from_torch)
            self.patch(keras.Layer, "__call__", tb._symbolic_calls_hidden_from_torch)


backend_hooks = KerasBackendHooks()
