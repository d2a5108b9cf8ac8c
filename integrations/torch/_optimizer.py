"""Optimizer: the global optimizer step pre-hook begins a step's Optimizer phase,
the exit of torch's ``Optimizer.step#`` range around it ends it (natively,
``csrc/torch/record_function.cc``); optimizers are noted as they are created."""

from __future__ import annotations

import functools
import threading

from stepscope.core import annotations, importhook
from stepscope.integrations.torch import _native_hooks


class OptimizerHooks:
    """The global optimizer step hooks of one ``instrument()``: native until dynamo
    may trace, then Python. Their handles go to ``handles`` (the instrumentor's, which
    uninstrument removes)."""

    def __init__(self, ctx, handles: list):
        self.ctx = ctx
        self.handles = handles
        self.native_handles = []  # the C hooks' handles, until dynamo may trace
        self.swapped = False  # the Python hooks replaced the C ones
        self.post_needed = False  # a step ran outside torch's range: a post-hook ends steps
        self.swap_lock = threading.Lock()
        self.optim_mod = None

    def install(self, optim_mod) -> None:
        """The global optimizer step pre-hook: a C callable (``csrc/torch/optimizer_hooks.cc``,
        no Python frame a step; the step's end is torch's range's exit) until dynamo may
        trace, then the Python one, which dynamo
        inlines when a compiled function steps an optimizer (a C callable would break its
        graph). Dynamo traces only what ``torch._dynamo.optimize`` (what ``torch.compile``
        calls) or ``optimize_assert`` wrapped: the first call of either swaps the hooks."""
        ctx = self.ctx
        self.optim_mod = optim_mod
        self.swapped = self.post_needed = False
        # the pre-hook alone: torch's Optimizer.step# range around the hooks ends the step
        # (csrc/torch/record_function.cc); a step outside one makes the pre-hook ask for the post-hook
        pre = _native_hooks.optimizer_hook(local=ctx.loops.local, compiler=ctx.compiler, only=ctx.only_optimizer,
                                           fail=ctx.fail, post=False, need_post=self.post_hook_needed)
        self.native_handles = [optim_mod.register_optimizer_step_pre_hook(pre)]
        self.handles.extend(self.native_handles)
        # torch._dynamo is imported by the first optimizer's construction (torch._disable_dynamo),
        # long before anything compiles: its entry points are patched then
        importhook.when_imported("torch._dynamo", self.watch_dynamo)

    def post_hook_needed(self) -> None:
        """An optimizer step ran outside torch's ``Optimizer.step#`` range (the pre-hook
        asks): a post-hook ends such steps from now on, the native one or, once dynamo
        may trace, the Python one."""
        ctx = self.ctx
        with self.swap_lock:
            if self.post_needed or not ctx.is_on():
                return
            self.post_needed = True
            if self.native_handles:
                post = _native_hooks.optimizer_hook(local=ctx.loops.local, compiler=ctx.compiler,
                                                    only=ctx.only_optimizer, fail=ctx.fail, post=True)
                handle = self.optim_mod.register_optimizer_step_post_hook(post)
                self.native_handles.append(handle)
                self.handles.append(handle)
            elif self.swapped:
                self.handles.append(self.optim_mod.register_optimizer_step_post_hook(self.python_hooks()[1]))

    def watch_dynamo(self, dynamo) -> None:
        if self.native_handles:  # not uninstrumented, not swapped yet
            for name in ("optimize", "optimize_assert"):
                if callable(getattr(dynamo, name, None)):
                    self.ctx.patch(dynamo, name, self.wrap_dynamo_entry)

    def wrap_dynamo_entry(self, original):
        hooks = self

        @functools.wraps(original)
        def entry(*args, **kwargs):
            try:
                hooks.dynamo_may_trace()
            except Exception as exc:  # noqa: BLE001
                hooks.ctx.fail(exc)
            return original(*args, **kwargs)

        return entry

    def dynamo_may_trace(self) -> None:
        """Swaps the native optimizer hooks for the Python ones (once): the pre-hook, and
        the post-hook only where a step ran outside torch's range before."""
        with self.swap_lock:
            handles, self.native_handles = self.native_handles, []
            if not handles:
                return
            for handle in handles:
                handle.remove()
                self.handles.remove(handle)
            self.swapped = True
            pre, post = self.python_hooks()
            self.handles.append(self.optim_mod.register_optimizer_step_pre_hook(pre))
            if self.post_needed:
                self.handles.append(self.optim_mod.register_optimizer_step_post_hook(post))

    def python_hooks(self):
        """The Python hooks: dynamo inlines them when a compiled function steps an
        optimizer and folds their ``is_dynamo_compiling()`` check; the bookkeeping is one
        native call on the thread's loop state (``csrc/torch/loop.cc``). The post-hook is
        registered only where a step ran outside torch's ``Optimizer.step#`` range, whose
        exit ends the step otherwise."""
        ctx = self.ctx
        local, only, fail = ctx.loops.local, ctx.only_optimizer, ctx.fail
        is_dynamo_compiling, compiler = ctx.is_dynamo_compiling, ctx.compiler
        # on every step: the native functions, positional (local, key)
        began, done = _native_hooks.optimizer_began, _native_hooks.optimizer_done

        post_needed = self.post_hook_needed

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
        """An optimizer created: its steps may be compiled (its parameters' versions tell
        them, ``_compile.py``), and a loop may begin with a model not seen yet."""
        ctx = self.ctx

        def __init__(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            if ctx.is_on():
                try:
                    ctx.optimizers[id(optimizer)] = optimizer
                except TypeError:  # a class with __slots__ and no __weakref__: its compiled steps go unseen
                    pass
                try:
                    tracker = ctx.loops.local.s.tracker
                    if tracker.trained:
                        # another loop begins (a second model, the next fold): the last step
                        # ends where its work ended, the build of the next is between loops
                        tracker.loop_ended()
                        annotations.new_loop()
                    tracker.optimizer_known(id(optimizer))
                    ctx.roots.look_again()
                except Exception as exc:  # noqa: BLE001
                    ctx.fail(exc)

        return __init__
