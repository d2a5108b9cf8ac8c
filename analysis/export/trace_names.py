"""What the trace exports (Chrome JSON, Perfetto) call stepscope's categories and steps:
PyTorch's profiler's names, so tools that read its traces read ours."""

from __future__ import annotations

from stepscope.core.vocabulary import TRAIN

# stepscope categories as PyTorch's profiler names them
CPU_CATS = {"phase": "user_annotation", "annotation": "user_annotation", "op": "cpu_op",
            "module": "python_function", "framework": "cpu_op"}
GPU_CATS = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "sync": "cuda_sync"}


def step_name(mode: str, step: int) -> str:
    """PyTorch's profiler names train steps ``ProfilerStep#N``; other modes follow suit."""
    return f"ProfilerStep#{step}" if mode == TRAIN else f"{mode}Step#{step}"
