"""``torch.profiler.record_function`` and ``torch.cuda.nvtx`` ranges already in the
user's code, recorded as annotations (``integrations/_ranges.py``).

``record_function`` is patched at its ``__enter__``/``__exit__``, so the context
manager and the decorator (which re-enters the same object) are both seen;
dynamo treats the class as a profiler context and never runs them, and
``torch.jit.script`` still compiles the class (the corpus scripts, saves and
reloads a model with a range where stepscope is absent). torch wraps
some of its own calls in ``record_function`` on every step (optimizer step and
zero_grad, DataLoader ``__next__``, DDP forward, torch.profiler's steps), in
native wrappers (``csrc/torch/record_function.cc``) that run three times a step on each side.
Three of them are the loop's own marks, and report it with no Python frame:
a DataLoader's ``__next__`` is one fetch (GetNext), an optimizer's
``zero_grad`` a framework span, and the exit of the range around an optimizer
step ends that step (its pre-hook began it). The others duplicate stepscope's
phases and are passed over by name.

``torch.cuda.nvtx`` is patched only where torch was built with NVTX; elsewhere
its functions raise whatever stepscope does, and stay untouched.
"""

from __future__ import annotations

from stepscope.core.recording import FRAMEWORK, intern
from stepscope.integrations._ranges import Ranges, arg, call_then
from stepscope.integrations.torch import _native_hooks

# torch's own ranges, entered on every step (torch/optim/optimizer.py,
# torch/utils/data/dataloader.py, torch/nn/parallel, torch/profiler/profiler.py)
TORCH_OWN = ("Optimizer.step#", "Optimizer.zero_grad#", "enumerate(DataLoader)#", "enumerate(DataPipe)#",
             "DataParallel.forward", "DistributedDataParallel.forward", "ProfilerStep#", "[pl][")

# ...of which these are the loop's fetches and optimizer chores (reported natively)
FETCHES = ("enumerate(DataLoader)#",)
ZERO_GRADS = ("Optimizer.zero_grad#",)
# ...and the range around each optimizer step and its hooks: its exit ends the step
OPTIMIZER_STEPS = ("Optimizer.step#",)
ZERO_GRAD = intern("Optimizer.zero_grad")

ranges = Ranges()


def install(ctx) -> None:
    from torch.autograd import profiler

    torch = ctx.torch
    cls = profiler.record_function
    ctx.patch(cls, "__enter__", lambda original: _enter(ctx, original))
    ctx.patch(cls, "__exit__", lambda original: _exit(ctx, original))
    nvtx = getattr(torch.cuda, "nvtx", None)
    if nvtx is not None and hasattr(torch._C, "_nvtx"):
        # (torch.cuda.nvtx.range, the context manager, calls range_push and range_pop)
        _nvtx(ctx, nvtx, "range_push", lambda a, k, _: ranges.push(arg(a, k, 0, "msg", ""), "nvtx"))
        _nvtx(ctx, nvtx, "range_pop", lambda a, k, _: ranges.pop("nvtx"))
        _nvtx(ctx, nvtx, "range_start", lambda a, k, rid: ranges.start(arg(a, k, 0, "msg", ""), ("torch", rid)))
        _nvtx(ctx, nvtx, "range_end", lambda a, k, _: ranges.end(("torch", arg(a, k, 0, "range_id"))))
        _nvtx(ctx, nvtx, "mark", lambda a, k, _: ranges.mark(arg(a, k, 0, "msg", "")))


def uninstall() -> None:
    ranges.clear()


def _loop(ctx) -> tuple:
    return (ctx.loops.local, FETCHES, ZERO_GRADS, FRAMEWORK, ZERO_GRAD, OPTIMIZER_STEPS)


def _enter(ctx, original):
    # native: a Python frame here costs ~1 us, three times a step (torch's own ranges)
    return _native_hooks.filtered_enter(original=original, record=ranges.push, prefixes=TORCH_OWN, fail=ctx.fail,
                                        loop=_loop(ctx))


def _exit(ctx, original):
    # ranges.local.stack is empty on a thread where only torch's own ranges were entered
    return _native_hooks.guarded_exit(original=original, record=ranges.pop, local=ranges.local, fail=ctx.fail,
                                      loop=_loop(ctx))


def _nvtx(ctx, owner, name: str, record) -> None:
    ctx.patch(owner, name, lambda original: call_then(original, record, ctx.fail))
