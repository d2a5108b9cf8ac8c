"""One owner of CUPTI per process: stepscope stands aside for torch.profiler.

torch.profiler (Kineto) registers its own CUPTI buffer callbacks. From its
``_prepare_trace`` to its ``__exit__`` stepscope flushes and pauses its GPU
activity tracing (``core.gpu``), then resumes it and notes the gap in run.json.
"""

from __future__ import annotations

from stepscope.core import gpu
from stepscope.integrations.torch import _ops


def install(ctx) -> None:
    """Patches torch.autograd.profiler.profile through the instrumentor's registry."""
    from torch.autograd import profiler

    profile = getattr(profiler, "profile", None)
    if profile is None or not hasattr(profile, "_prepare_trace"):
        return

    def wrap_prepare(original):
        def _prepare_trace(self, *args, **kwargs):
            _ops.user_profiler_starting()  # stepscope's operator window gives the profiler up
            gpu.pause_activity_tracing()
            return original(self, *args, **kwargs)

        return _prepare_trace

    def wrap_exit(original):
        def __exit__(self, *exc):
            try:
                return original(self, *exc)
            finally:
                gpu.resume_activity_tracing("torch.profiler")

        return __exit__

    ctx.patch(profile, "_prepare_trace", wrap_prepare)
    ctx.patch(profile, "__exit__", wrap_exit)
