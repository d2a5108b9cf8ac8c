"""The PyTorch instrumentor: what is patched, and what each patch reports.

* GetNext   the ``record_function`` range of ``_BaseDataLoaderIter.__next__``,
            in native code (``_annotations.py``); ``DataLoader.__iter__`` (worker
            start at each epoch) counts toward the next step's GetNext
            (``_fetch.py``); the workers' own fetches (``_workers.py``).
* Forward   the outermost modules (``_roots.py``, ``_forward.py``); Loss: outermost ``_Loss``
            modules, otherwise the time between Forward and Backward. (The
            functional losses are not patched: TorchScript compiles whatever
            ``F.cross_entropy`` is, so a wrapper there breaks ``jit.script``.)
* Backward  the engine call both ``torch.autograd.backward`` and ``grad`` make
            (``Tensor.backward`` calls the former), in native code; nested calls
            count once; forwards inside it are ``Recompute``.
* Optimizer the global optimizer step pre-hook (``_optimizer.py``), to the exit of torch's
            ``Optimizer.step#`` range around it (natively); ``zero_grad`` is a
            framework annotation (its ``record_function`` range, natively).
* Collectives torch.distributed's calls, ``Work.wait`` and DDP's bucketed all-reduce
            (``_collectives.py``).
* Annotations the user's code already makes for other tools:
            ``record_function`` and ``torch.cuda.nvtx`` ranges (``_annotations.py``).

Every hook returns at once while dynamo traces or export runs (what
``torch.compiler.is_compiling()`` tells, read without its extra call).

Each part is given a ``TorchContext`` (``_context.py``): what it needs of the
instrumentor, never the instrumentor itself.
"""

from __future__ import annotations

import functools
import os
import weakref

from stepscope.core import runinfo, session
from stepscope.integrations._base import Instrumentor
from stepscope.integrations._steps import StepTracker
from stepscope.integrations.torch import (_amp, _annotations, _collectives, _compile_events, _fetch, _funcol,
                                          _handover, _native_hooks, _ops, _p2p, _workers)
from stepscope.integrations.torch._compile import wrap_compile, wrap_module_compile
from stepscope.integrations.torch._context import TorchContext
from stepscope.integrations.torch._distributed import distributed_rank, patch_init_process_group
from stepscope.integrations.torch._forward import Forwards, is_training
from stepscope.integrations.torch._loops import LoopState, Loops
from stepscope.integrations.torch._optimizer import OptimizerHooks
from stepscope.integrations.torch._roots import Roots

class _NotCompiling:
    _is_compiling_flag = False

    @staticmethod
    def is_dynamo_compiling() -> bool:
        return False


def _no_steps_in_loader_workers(torch):
    get_worker_info = torch.utils.data.get_worker_info
    return lambda: get_worker_info() is None


class TorchInstrumentor(Instrumentor):
    name = "torch"
    module = "torch"
    distribution = "torch"
    supported = ">=2.1"

    def __init__(self):
        super().__init__()
        self.torch = None
        self.context = None
        self.loops = None
        self.roots = None
        self.forwards = None
        self.optimizer_hooks = None
        self.hook_handles = []
        self.fork_hook = False

    is_training = staticmethod(is_training)

    # --- state: per thread (_loops.py) ----------------------------------------------------
    @property
    def loop(self) -> LoopState:
        """The calling thread's loop state."""
        return self.loops.local.s

    @property
    def tracker(self) -> StepTracker:
        """The calling thread's step tracker."""
        return self.loops.local.s.tracker

    def _new_tracker(self) -> StepTracker:
        tracker = StepTracker(on_new_step=self.roots.step_completed,
                              may_begin=_no_steps_in_loader_workers(self.torch))
        tracker.every_step = self.roots.discovery is not None
        # a fetch leaves its mode to its work (csrc/torch/record_function.cc)
        tracker.guess = self.forwards.guess_fetch_mode
        return tracker

    def _instrument(self, model=None, optimizer=None) -> None:
        import torch

        self.torch = torch
        compiler = getattr(torch, "compiler", None) or _NotCompiling
        ctx = self.context = TorchContext(
            torch=torch, compiler=compiler,
            is_dynamo_compiling=getattr(compiler, "is_dynamo_compiling", _NotCompiling.is_dynamo_compiling),
            only_optimizer=None if optimizer is None else id(optimizer),
            # weak references to the DataLoaders iterated before (discovery: _fetch.py); a set, which
            # csrc/torch/passes.cc reads directly
            loaders_seen=set(),
            # optimizers created since, by id (values: no hashing): a compiled call's step is told by their parameters
            optimizers=weakref.WeakValueDictionary(),
            fail=self.fail, patch=self.patch, replace=self.replace, is_on=self.is_instrumented)
        self.forwards = ctx.forwards = Forwards(ctx)
        self.roots = ctx.roots = Roots(ctx, fixed=model is not None)
        self.loops = ctx.loops = Loops(self._new_tracker)
        self.optimizer_hooks = OptimizerHooks(ctx, self.hook_handles)
        from torch.optim import optimizer as optim_mod
        from torch.utils.data import dataloader

        self.patch(dataloader.DataLoader, "__iter__", functools.partial(_fetch.wrap_iter, ctx))
        self.patch_backward(torch)
        _workers.install(ctx)
        self.optimizer_hooks.install(optim_mod)
        self.patch(optim_mod.Optimizer, "__init__", self.optimizer_hooks.wrap_optimizer_init)
        _amp.install(ctx)
        if hasattr(torch.nn.Module, "compile"):
            self.patch(torch.nn.Module, "compile", functools.partial(wrap_module_compile, ctx))
        if hasattr(torch, "compile"):
            self.patch(torch, "compile", functools.partial(wrap_compile, ctx))
        _handover.install(ctx)
        _ops.install(ctx)
        _annotations.install(ctx)
        patch_init_process_group(ctx)
        collectives = _collectives.install(ctx)
        if collectives is not None:  # point-to-point and functional collectives, numbered with the others
            _p2p.PointToPoint(collectives).install()
            _funcol.install(collectives)
        _compile_events.install(ctx)
        for name in ("trace", "trace_module"):  # tracing runs the model: no steps, no phases
            self.patch(torch.jit, name, self.forwards.hiding)
        self.patch(torch.nn.Module, "train", self.forwards.wrap_train)
        self.hide_root_slots_from_torchscript(torch)
        if hasattr(torch.nn.Module, "_replicate_for_data_parallel"):
            self.patch(torch.nn.Module, "_replicate_for_data_parallel", self.wrap_replicate)
        if model is not None:
            self.roots.adopt(model)
        elif not self.roots.adopt_compiled_before():
            self.roots.start_discovery()
        session.on_stop(self.close_steps)
        runinfo.register_rank_provider(distributed_rank)
        if hasattr(os, "register_at_fork") and not self.fork_hook:
            os.register_at_fork(after_in_child=self._after_fork_in_child)  # cannot be unregistered: once
            self.fork_hook = True

    def _uninstrument(self) -> None:
        if self.loops is not None:
            self.loops.close_all()
        _ops.uninstall()
        _annotations.uninstall()
        if self.roots is not None:
            self.roots.release()
        if self.optimizer_hooks is not None:
            self.optimizer_hooks.native_handles = []
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles.clear()

    def close_steps(self) -> None:
        if self._on and self.loops is not None:
            self.loops.close_all()

    def _after_fork_in_child(self) -> None:
        # A forked child inherits no open step and no half-finished phase.
        if self._on and self.loops is not None:
            self.loops.reset()
            _annotations.ranges.clear()

    def wrap_replicate(self, original):
        inst = self

        def _replicate_for_data_parallel(module):
            replica = original(module)
            try:
                inst.roots.drop_from_replica(module, replica)
            except Exception as exc:  # noqa: BLE001
                inst.fail(exc)
            return replica

        return _replicate_for_data_parallel

    def hide_root_slots_from_torchscript(self, torch) -> None:
        """TorchScript (``jit.script``, and ``jit.trace`` building its module) types
        every entry of a module's ``__dict__``: a root's slot holds a native callable
        it cannot type (a Python function there it would skip). The slot is not the
        model's: TorchScript is told to ignore it, as it ignores torch's own hook dicts."""
        recursive = getattr(getattr(torch, "jit", None), "_recursive", None)
        ignored = getattr(recursive, "ignored_attributes", None)
        if isinstance(ignored, list) and "_compiled_call_impl" not in ignored:
            self.replace(recursive, "ignored_attributes", [*ignored, "_compiled_call_impl"])

    def patch_backward(self, torch) -> None:
        """Backward is timed around the engine call that ``torch.autograd.backward``
        and ``grad`` both end in: their own argument warnings (stacklevel=2) then
        still name the user's line. Both names of it are patched: torch.compiler
        swaps them for a while and puts back what it found. Older torch: the two
        public functions."""
        graph = getattr(torch.autograd, "graph", None)
        engine = getattr(graph, "_engine_run_backward", None)
        if engine is not None and getattr(torch.autograd, "_engine_run_backward", None) is engine:
            wrapped = self.patch(graph, "_engine_run_backward", self.wrap_backward)
            self.replace(torch.autograd, "_engine_run_backward", wrapped)
        else:
            self.patch(torch.autograd, "backward", self.wrap_backward)
            self.patch(torch.autograd, "grad", self.wrap_backward)

    # --- GetNext (_fetch.py) ------------------------------------------------------------------
    def loop_starting(self, t0: int, loader=None) -> None:
        _fetch.loop_starting(self.context, t0, loader)

    # --- backward ---------------------------------------------------------------------------
    def wrap_backward(self, original):
        # native (csrc/torch/backward.cc): no Python frame on every step; dynamo never reaches it
        return _native_hooks.timed_backward(original=original, state=self.loops.local,
                                            compiler=self.context.compiler, fail=self.fail)
