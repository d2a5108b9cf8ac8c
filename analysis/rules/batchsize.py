"""BatchSize: GPU, host CPU and GPU memory all low - the batch could grow."""

from __future__ import annotations

from stepscope.analysis.rules.utilization import LowGPUCause
from stepscope.analysis.rules.windows import BATCH_CPU, BATCH_GPU_MEMORY, COMMON


class BatchSize(LowGPUCause):
    name = "BatchSize"
    summary = ("A GPU is below the utilization threshold while the host CPU and the GPU's memory both have room "
               "to spare: a larger batch would keep the GPU busier.")
    params = {**COMMON, "max_cpu": BATCH_CPU, "max_gpu_memory": BATCH_GPU_MEMORY}
    cause = "batch"
    needs = {"cpu_util": "host CPU", "gpu_memory_used_percent": "GPU memory"}

    def describe(self, where, share, m, p, framework):
        message = (f"{where} has room for a larger batch: {m['gpu_util']:.0f}% GPU utilization, "
                   f"{m['gpu_memory_percent']:.0f}% of GPU memory used and {m['cpu_util']:.0f}% host CPU, for "
                   f"{100 * share:.0f}% of the training loop")
        recommendation = ("Raise the batch size (scale the learning rate with it, e.g. linearly with warm-up) "
                          "until GPU memory is mostly used; or train a larger model on the same GPU, or share "
                          "the GPU (several jobs, MIG) if the model is fixed.")
        return message, recommendation
