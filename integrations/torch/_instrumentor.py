"""The PyTorch instrumentor: what is patched, and what each patch reports.

* GetNext   the ``record_function`` range of ``_BaseDataLoaderIter.__next__``,
            in native code (``_annotations.py``); ``DataLoader.__iter__`` (worker
            start at each epoch) counts toward the next step's GetNext
            (``_fetch.py``); the workers' own fetches (``_workers.py``).
* Forward   the outermost modules (``_roots.py``); Loss: outermost ``_Loss``
            modules, otherwise the time between Forward and Backward. (The
            functional losses are not patched: TorchScript compiles whatever
            ``F.cross_entropy`` is, so a wrapper there breaks ``jit.script``.)
* Backward  the engine call both ``torch.autograd.backward`` and ``grad`` make
            (``Tensor.backward`` calls the former), in native code; nested calls
            count once; forwards inside it are ``Recompute``.
* Optimizer the global optimizer step pre-hook, to the exit of torch's
            ``Optimizer.step#`` range around it (natively); ``zero_grad`` is a
            framework annotation (its ``record_function`` range, natively).
* Annotations the user's code already makes for other tools:
            ``record_function`` and ``torch.cuda.nvtx`` ranges (``_annotations.py``).

Every hook returns at once while dynamo traces or export runs (what
``torch.compiler.is_compiling()`` tells, read without its extra call).
"""

from __future__ import annotations

import functools
import os
import threading
import weakref

from stepscope.core import _native, importhook, runinfo, session
from stepscope.integrations._base import Instrumentor
from stepscope.integrations._steps import FORWARD, LOSS, RECOMPUTE, StepTracker
from stepscope.integrations.torch import _amp, _annotations, _fetch, _handover, _ops, _workers
from stepscope.integrations.torch._compile import wrap_compile, wrap_module_compile
from stepscope.integrations.torch._distributed import distributed_rank, patch_init_process_group
from stepscope.integrations.torch._loops import LoopState, Loops
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
        self.loops = None
        self.roots = None
        self.hook_handles = []
        self.native_hook_handles = []  # the C optimizer hooks' handles, until dynamo may trace
        self.swapped = False  # the Python optimizer hooks replaced the C ones
        self.post_hook_needed = False  # a step ran outside torch's range: a post-hook ends steps
        self.swap_lock = threading.Lock()
        self.fork_hook = False
        self.noted: set = set()  # compiled functions already noted in run.json

    def is_compiling(self) -> bool:
        return self.is_dynamo_compiling() or self.compiler._is_compiling_flag

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
        tracker.guess = self.guess_fetch_mode  # a fetch leaves its mode to its work (csrc/torch/hooks.cc)
        return tracker

    def _instrument(self, model=None, optimizer=None) -> None:
        import torch

        self.torch = torch
        self.only_optimizer = None if optimizer is None else id(optimizer)
        # torch.compiler.is_compiling() is these two (and a TorchScript check our hooks never need):
        # dynamo folds is_dynamo_compiling() to True while it traces; export sets the flag
        self.compiler = getattr(torch, "compiler", None) or _NotCompiling
        self.is_dynamo_compiling = getattr(self.compiler, "is_dynamo_compiling", _NotCompiling.is_dynamo_compiling)
        self.roots = Roots(self, torch, fixed=model is not None)
        self.loops = Loops(self._new_tracker)
        # weak references to the DataLoaders iterated before (discovery: _fetch.py); a set, which
        # csrc/torch/passes.cc reads directly
        self.loaders_seen = set()
        # optimizers created since, by id (values: no hashing): a compiled call's step is told by their parameters
        self.optimizers = weakref.WeakValueDictionary()
        from torch.optim import optimizer as optim_mod
        from torch.utils.data import dataloader

        self.patch(dataloader.DataLoader, "__iter__", functools.partial(_fetch.wrap_iter, self))
        self.patch_backward(torch)
        _workers.install(self, torch)
        self.install_optimizer_hooks(optim_mod)
        self.patch(optim_mod.Optimizer, "__init__", self.wrap_optimizer_init)
        _amp.install(self, torch)
        if hasattr(torch.nn.Module, "compile"):
            self.patch(torch.nn.Module, "compile", functools.partial(wrap_module_compile, self))
        if hasattr(torch, "compile"):
            self.patch(torch, "compile", functools.partial(wrap_compile, self))
        _handover.install(self)
        _ops.install(self, torch)
        _annotations.install(self, torch)
        patch_init_process_group(self, torch)
        for name in ("trace", "trace_module"):  # tracing runs the model: no steps, no phases
            self.patch(torch.jit, name, self.hiding)
        self.patch(torch.nn.Module, "train", self.wrap_train)
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
        self.native_hook_handles = []
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

    # --- modes ----------------------------------------------------------------------------
    @staticmethod
    def is_training(module) -> bool:
        """train()/eval() of a model, looking through wrappers (DDP, DataParallel,
        Lightning's) whose own flag is not always kept in step with the model's."""
        for _ in range(4):
            if module.training:
                return True
            inner = getattr(module, "module", None)
            if inner is None or inner is module or not hasattr(inner, "training"):
                return False
            module = inner
        return False

    def mode_of(self, module, st: LoopState) -> str:
        if st.forced_modes:
            return st.forced_modes[-1]
        return "train" if self.torch.is_grad_enabled() and self.is_training(module) else "eval"

    def guess_fetch_mode(self) -> str:
        """The mode of a fetched batch on which no work showed (the tracker asks)."""
        return self.guess_mode(self.loops.local.s)

    def guess_mode(self, st: LoopState) -> str:
        """A fetched batch's mode, before its forward shows it."""
        if st.forced_modes:
            return st.forced_modes[-1]
        if not self.torch.is_grad_enabled():
            return "eval"
        models = self.roots.models
        if not models or models[0].training:
            return "train"
        return "train" if any(self.is_training(m) for m in models) else "eval"

    # --- forward (called by the roots' timed calls) -------------------------------------------
    def root_pre(self, module, st: LoopState) -> None:
        try:
            st.depth += 1
            if st.depth > 1:
                return
            if st.in_backward:
                st.stack.append((_native.now(), "train", RECOMPUTE, None))
            elif self.roots.is_loss(module):
                st.stack.append((_native.now(), "train", LOSS, None))
            else:
                if self.roots.stop_at_known is st and module is not st.pending_root:
                    self.roots.known_root_ran(st)
                mode = self.mode_of(module, st)
                now = _native.now()
                # a part of one directly called forward (_roots.py): its group, and the part
                # named as the native path names it, by the root's timed call
                group = self.roots.group_of.get(module)
                part = None if group is None else (group, self.roots.timed[module][0])
                # acting (the native roots' flag): eval only because grad is off, the module training
                acting = not st.forced_modes and mode == "eval" and module.training
                st.tracker.forward_started(mode, now, *(part or (None, None)), acting)
                st.stack.append((now, mode, FORWARD, part))
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def root_post(self, st: LoopState) -> None:
        try:
            st.depth -= 1
            if st.depth > 0 or not st.stack:
                st.depth = max(st.depth, 0)
                return
            t0, mode, phase, part = st.stack.pop()
            t1 = _native.now()
            if phase == LOSS:
                st.tracker.loss(t0, t1)
            elif part is not None:
                st.tracker.forward_ended(mode, t0, t1, phase, *part)
            else:
                st.tracker.forward_ended(mode, t0, t1, phase)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def hiding(self, original):
        inst = self

        def hidden_call(*args, **kwargs):
            st = inst.loops.local.s
            st.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                st.depth = max(0, st.depth - 1)

        return hidden_call

    def wrap_train(self, original):
        """model.train()/eval() announce a loop, maybe of a model not seen yet (one
        loaded from disk): discovery looks again."""
        inst = self

        def train(module, mode=True):
            if not inst._on:
                return original(module, mode)
            st = inst.loops.local.s
            if st.setting_mode:  # children of the module being set
                return original(module, mode)
            st.setting_mode = True
            try:
                if not st.depth and module not in inst.roots.timed:
                    inst.roots.look_again(until_known_root=True)
                return original(module, mode)
            finally:
                st.setting_mode = False

        return train

    # --- GetNext (_fetch.py) ------------------------------------------------------------------
    def loop_starting(self, t0: int, loader=None) -> None:
        _fetch.loop_starting(self, t0, loader)

    # --- backward ---------------------------------------------------------------------------
    def wrap_backward(self, original):
        # native (csrc/torch/hooks.cc): no Python frame on every step; dynamo never reaches it
        return _native.timed_backward(original, self.loops.local, self.compiler, self.fail)

    # --- optimizer --------------------------------------------------------------------------
    def install_optimizer_hooks(self, optim_mod) -> None:
        """The global optimizer step pre-hook: a C callable (``csrc/torch/optimizer_hooks.cc``,
        no Python frame a step; the step's end is torch's range's exit) until dynamo may
        trace, then the Python one, which dynamo
        inlines when a compiled function steps an optimizer (a C callable would break its
        graph). Dynamo traces only what ``torch._dynamo.optimize`` (what ``torch.compile``
        calls) or ``optimize_assert`` wrapped: the first call of either swaps the hooks."""
        local, compiler, fail = self.loops.local, self.compiler, self.fail
        self.optim_mod = optim_mod
        self.swapped = self.post_hook_needed = False
        # the pre-hook alone: torch's Optimizer.step# range around the hooks ends the step
        # (csrc/torch/hooks.cc); a step outside one makes the pre-hook ask for the post-hook
        pre = _native.optimizer_hook(local, compiler, self.only_optimizer, fail, False, self.optimizer_post_needed)
        self.native_hook_handles = [optim_mod.register_optimizer_step_pre_hook(pre)]
        self.hook_handles.extend(self.native_hook_handles)
        # torch._dynamo is imported by the first optimizer's construction (torch._disable_dynamo),
        # long before anything compiles: its entry points are patched then
        importhook.when_imported("torch._dynamo", self.watch_dynamo)

    def optimizer_post_needed(self) -> None:
        """An optimizer step ran outside torch's ``Optimizer.step#`` range (the pre-hook
        asks): a post-hook ends such steps from now on, the native one or, once dynamo
        may trace, the Python one."""
        with self.swap_lock:
            if self.post_hook_needed or not self.is_instrumented():
                return
            self.post_hook_needed = True
            if self.native_hook_handles:
                post = _native.optimizer_hook(self.loops.local, self.compiler, self.only_optimizer, self.fail, True)
                handle = self.optim_mod.register_optimizer_step_post_hook(post)
                self.native_hook_handles.append(handle)
                self.hook_handles.append(handle)
            elif self.swapped:
                self.hook_handles.append(self.optim_mod.register_optimizer_step_post_hook(self.optimizer_hooks()[1]))

    def watch_dynamo(self, dynamo) -> None:
        if self.native_hook_handles:  # not uninstrumented, not swapped yet
            for name in ("optimize", "optimize_assert"):
                if callable(getattr(dynamo, name, None)):
                    self.patch(dynamo, name, self.wrap_dynamo_entry)

    def wrap_dynamo_entry(self, original):
        inst = self

        @functools.wraps(original)
        def entry(*args, **kwargs):
            try:
                inst.dynamo_may_trace()
            except Exception as exc:  # noqa: BLE001
                inst.fail(exc)
            return original(*args, **kwargs)

        return entry

    def dynamo_may_trace(self) -> None:
        """Swaps the native optimizer hooks for the Python ones (once): the pre-hook, and
        the post-hook only where a step ran outside torch's range before."""
        with self.swap_lock:
            handles, self.native_hook_handles = self.native_hook_handles, []
            if not handles:
                return
            for handle in handles:
                handle.remove()
                self.hook_handles.remove(handle)
            self.swapped = True
            pre, post = self.optimizer_hooks()
            self.hook_handles.append(self.optim_mod.register_optimizer_step_pre_hook(pre))
            if self.post_hook_needed:
                self.hook_handles.append(self.optim_mod.register_optimizer_step_post_hook(post))

    def optimizer_hooks(self):
        """The Python hooks: dynamo inlines them when a compiled function steps an
        optimizer and folds their ``is_dynamo_compiling()`` check; the bookkeeping is one
        native call on the thread's loop state (``csrc/torch/loop.cc``). The post-hook is
        registered only where a step ran outside torch's ``Optimizer.step#`` range, whose
        exit ends the step otherwise."""
        local, only, fail = self.loops.local, self.only_optimizer, self.fail
        is_dynamo_compiling, compiler = self.is_dynamo_compiling, self.compiler
        began, done = _native.optimizer_began, _native.optimizer_done

        post_needed = self.optimizer_post_needed

        def optimizer_pre(optimizer, args, kwargs):
            if is_dynamo_compiling() or compiler._is_compiling_flag or (only is not None and id(optimizer) != only):
                return None
            try:
                if not began(local, id(optimizer)):  # no torch range around this step will end it
                    post_needed()
            except Exception as exc:  # noqa: BLE001
                fail(exc)
            return None

        def optimizer_post(optimizer, args, kwargs):
            if is_dynamo_compiling() or compiler._is_compiling_flag or (only is not None and id(optimizer) != only):
                return None
            try:
                done(local, id(optimizer))
            except Exception as exc:  # noqa: BLE001
                fail(exc)
            return None

        return optimizer_pre, optimizer_post

    def wrap_optimizer_init(self, original):
        inst = self

        def __init__(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            if inst._on:
                try:
                    inst.optimizers[id(optimizer)] = optimizer
                except TypeError:  # a class with __slots__ and no __weakref__: its compiled steps go unseen
                    pass
                try:
                    inst.loops.local.s.tracker.optimizer_known(id(optimizer))
                    inst.roots.look_again()
                except Exception as exc:  # noqa: BLE001
                    inst.fail(exc)

        return __init__
