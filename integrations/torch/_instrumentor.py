"""The PyTorch instrumentor: what is patched, and what each patch reports.

* GetNext   ``_BaseDataLoaderIter.__next__``; ``DataLoader.__iter__`` (worker
            start at each epoch) counts toward the next step's GetNext. Whatever
            runs inside a fetch (an ``nn.Module`` transform in ``__getitem__``)
            is part of the fetch, never a forward.
* Forward   the outermost modules (``_roots.py``); Loss: outermost ``_Loss``
            modules, otherwise the time between Forward and Backward. (The
            functional losses are not patched: TorchScript compiles whatever
            ``F.cross_entropy`` is, so a wrapper there breaks ``jit.script``.)
* Backward  ``torch.autograd.backward``/``grad`` (``Tensor.backward`` calls the
            former; they are the only callers of the engine); nested calls count
            once; forwards inside it are ``Recompute``.
* Optimizer the global optimizer step pre/post hooks; ``zero_grad`` is a
            framework annotation.

Every hook returns at once while dynamo traces (``torch.compiler.is_compiling()``).
"""

from __future__ import annotations

import functools
import os
import sys

from stepscope.core import _native, runinfo, session
from stepscope.integrations._base import Instrumentor
from stepscope.integrations._steps import FORWARD, LOSS, RECOMPUTE, StepTracker
from stepscope.integrations.torch import _handover
from stepscope.integrations.torch._roots import Roots

FRAMEWORK = _native.CATEGORIES.index("framework")
ZERO_GRAD = _native.intern("Optimizer.zero_grad")

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
        self.tracker = None
        self.roots = None
        self.hook_handles = []
        self.fork_hook = False
        self.noted: set = set()  # compiled functions already noted in run.json

    # --- state --------------------------------------------------------------------------
    def _reset_state(self) -> None:
        self.depth = 0  # root forwards (or a fetch) in progress: nested work is theirs
        self.in_backward = 0
        self.in_optimizer = 0
        self.stack = []  # (t0, mode, phase) of open root forwards
        self.forced_modes = []  # a framework loop that knows its mode (Keras fit/evaluate/predict)
        self.optimizer_t0 = 0
        self.iter_started = None  # tick: DataLoader.__iter__ began, no fetch since
        self.setting_mode = False  # inside Module.train(): its children's calls are its own

    def _instrument(self, model=None, optimizer=None) -> None:
        import torch

        self.torch = torch
        self._reset_state()
        self.only_optimizer = None if optimizer is None else id(optimizer)
        self.is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        self.roots = Roots(self, torch, fixed=model is not None)
        self.tracker = StepTracker(on_new_step=self.roots.step_completed,
                                   may_begin=_no_steps_in_loader_workers(torch))
        from torch.optim import optimizer as optim_mod
        from torch.utils.data import dataloader

        self.patch(dataloader._BaseDataLoaderIter, "__next__", self.wrap_next)
        self.patch(dataloader.DataLoader, "__iter__", self.wrap_iter)
        self.patch(torch.autograd, "backward", self.wrap_backward)
        self.patch(torch.autograd, "grad", self.wrap_backward)
        self.hook_handles.append(optim_mod.register_optimizer_step_pre_hook(self.optimizer_pre))
        self.hook_handles.append(optim_mod.register_optimizer_step_post_hook(self.optimizer_post))
        self.patch(optim_mod.Optimizer, "zero_grad", self.wrap_zero_grad)
        self.patch(optim_mod.Optimizer, "__init__", self.wrap_optimizer_init)
        if hasattr(torch.nn.Module, "compile"):
            self.patch(torch.nn.Module, "compile", self.wrap_module_compile)
        if hasattr(torch, "compile"):
            self.patch(torch, "compile", self.wrap_compile)
        _handover.install(self)
        self.patch_init_process_group(torch)
        for name in ("trace", "trace_module"):  # tracing runs the model: no steps, no phases
            self.patch(torch.jit, name, self.hiding)
        self.patch(torch.nn.Module, "train", self.wrap_train)
        if model is not None:
            self.roots.adopt(model)
        else:
            self.roots.start_discovery()
        session.on_stop(self.close_steps)
        runinfo.register_rank_provider(distributed_rank)
        if hasattr(os, "register_at_fork") and not self.fork_hook:
            os.register_at_fork(after_in_child=self._after_fork_in_child)  # cannot be unregistered: once
            self.fork_hook = True

    def _uninstrument(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        if self.roots is not None:
            self.roots.release()
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles.clear()

    def close_steps(self) -> None:
        if self._on and self.tracker is not None:
            self.tracker.close()

    def _after_fork_in_child(self) -> None:
        # A forked child inherits no open step and no half-finished phase.
        if self._on and self.tracker is not None:
            self.tracker.reset()
            self._reset_state()

    def patch_init_process_group(self, torch) -> None:
        """Remember the rank a process joins with: torch.multiprocessing.spawn's
        children have no RANK in their environment, and scripts destroy the
        group before they exit."""
        dist = getattr(torch, "distributed", None)
        if dist is None or not dist.is_available():
            return
        from torch.distributed import distributed_c10d

        def wrap(original):
            def init_process_group(*args, **kwargs):
                result = original(*args, **kwargs)
                try:
                    runinfo.note_rank(dist.get_rank(), dist.get_world_size())
                except Exception:  # noqa: BLE001 - the rank is a nicety, the group is the user's
                    pass
                return result

            return init_process_group

        wrapped = self.patch(distributed_c10d, "init_process_group", wrap)
        if wrapped is not None and getattr(dist, "init_process_group", None) is not wrapped:
            self.replace(dist, "init_process_group", wrapped)

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

    def mode_of(self, module) -> str:
        if self.forced_modes:
            return self.forced_modes[-1]
        return "train" if self.torch.is_grad_enabled() and self.is_training(module) else "eval"

    def guess_mode(self) -> str:
        """A fetched batch's mode, before its forward shows it."""
        if self.forced_modes:
            return self.forced_modes[-1]
        if not self.torch.is_grad_enabled():
            return "eval"
        models = self.roots.models
        if not models or models[0].training:
            return "train"
        return "train" if any(self.is_training(m) for m in models) else "eval"

    # --- forward (called by the roots' timed calls) -------------------------------------------
    def root_pre(self, module) -> None:
        try:
            self.depth += 1
            if self.depth > 1:
                return
            if self.in_backward:
                self.stack.append((_native.now(), "train", RECOMPUTE))
            elif isinstance(module, self.roots.loss_type):
                self.stack.append((_native.now(), "train", LOSS))
            else:
                if self.roots.stop_at_known and module is not self.roots.pending_root:
                    self.roots.known_root_ran()
                mode = self.mode_of(module)
                now = _native.now()
                self.tracker.forward_started(mode, now)
                self.stack.append((now, mode, FORWARD))
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def root_post(self) -> None:
        try:
            self.depth -= 1
            if self.depth > 0 or not self.stack:
                self.depth = max(self.depth, 0)
                return
            t0, mode, phase = self.stack.pop()
            t1 = _native.now()
            if phase == LOSS:
                self.tracker.loss(t0, t1)
            else:
                self.tracker.forward_ended(mode, t0, t1, phase)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    # --- compile ------------------------------------------------------------------------------
    def wrap_compile(self, original):
        inst = self

        def compile(*args, **kwargs):
            try:
                inst.roots.compile_called()
            except Exception as exc:  # noqa: BLE001
                inst.fail(exc)
            result = original(*args, **kwargs)
            target = args[0] if args else kwargs.get("model")
            if target is None:  # @torch.compile(...) with options: a decorator
                decorator = result
                return functools.wraps(decorator)(lambda fn: inst.compiled(fn, decorator(fn)))
            return inst.compiled(target, result)

        return compile

    def compiled(self, target, result):
        """What torch.compile returned: a module is a root, timed outside dynamo; a
        compiled function that shows no phase inside is timed as a Forward."""
        try:
            if isinstance(result, self.torch.nn.Module):
                self.roots.adopt(result)
                return result
            if callable(result) and not isinstance(target, type):
                return _timed_compiled_function(self, result, getattr(target, "__qualname__", repr(target)))
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        return result

    def wrap_module_compile(self, original):
        inst = self

        def compile(module, *args, **kwargs):
            try:
                inst.roots.compile_called()
            except Exception as exc:  # noqa: BLE001
                inst.fail(exc)
            result = original(module, *args, **kwargs)
            try:
                inst.roots.rewrap(module)
            except Exception as exc:  # noqa: BLE001
                inst.fail(exc)
            return result

        return compile

    # --- GetNext ----------------------------------------------------------------------------
    def wrap_iter(self, original):
        inst = self

        def __iter__(loader):
            t0 = _native.now()
            result = original(loader)
            inst.loop_starting(t0)
            return result

        return __iter__

    def hiding(self, original):
        inst = self

        def hidden_call(*args, **kwargs):
            inst.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                inst.depth = max(0, inst.depth - 1)

        return hidden_call

    def wrap_train(self, original):
        """model.train()/eval() announce a loop, maybe of a model not seen yet (one
        loaded from disk): discovery looks again."""
        inst = self

        def train(module, mode=True):
            if inst.setting_mode or not inst._on:  # children of the module being set
                return original(module, mode)
            inst.setting_mode = True
            try:
                if not inst.depth and module not in inst.roots.timed:
                    inst.roots.look_again(until_known_root=True)
                return original(module, mode)
            finally:
                inst.setting_mode = False

        return train

    def loop_starting(self, t0: int) -> None:
        """A pass over a loader begins (its worker start belongs to the first fetch)."""
        if self.iter_started is None and not self.depth:
            self.iter_started = t0
            self.roots.look_again(until_known_root=True)
            try:
                self.tracker.loop_started()
            except Exception as exc:  # noqa: BLE001
                self.fail(exc)

    def wrap_next(self, original):
        inst = self

        def __next__(loader_iter):
            t0 = _native.now()
            if inst.iter_started is not None:
                t0, inst.iter_started = min(t0, inst.iter_started), None
            inst.depth += 1  # modules run by the dataset or collate are part of the fetch
            try:
                batch = original(loader_iter)
            except StopIteration:
                inst.depth -= 1
                if not inst.depth:
                    try:
                        inst.tracker.exhausted(t0, _native.now())
                    except Exception as exc:  # noqa: BLE001
                        inst.fail(exc)
                raise
            except BaseException:
                inst.depth -= 1
                raise
            inst.depth -= 1
            if not inst.depth:
                try:
                    inst.tracker.fetched(t0, _native.now(), inst.guess_mode())
                except Exception as exc:  # noqa: BLE001
                    inst.fail(exc)
            return batch

        return __next__

    # --- backward ---------------------------------------------------------------------------
    def wrap_backward(self, original):
        inst = self

        def backward(*args, **kwargs):
            if inst.in_backward or inst.is_compiling():
                return original(*args, **kwargs)
            t0 = _native.now()
            try:
                if not inst.depth:
                    inst.tracker.backward_started(t0, begins_step=not inst.in_optimizer)
            except Exception as exc:  # noqa: BLE001
                inst.fail(exc)
            inst.in_backward += 1
            try:
                return original(*args, **kwargs)
            finally:
                inst.in_backward -= 1
                try:
                    inst.tracker.backward_ended(t0, _native.now())
                except Exception as exc:  # noqa: BLE001
                    inst.fail(exc)

        return backward

    # --- optimizer --------------------------------------------------------------------------
    def optimizer_pre(self, optimizer, args, kwargs):
        if self.is_compiling() or (self.only_optimizer is not None and id(optimizer) != self.only_optimizer):
            return None
        try:
            self.in_optimizer += 1
            if self.in_optimizer == 1:
                now = _native.now()
                self.tracker.optimizer_started(id(optimizer), now)
                self.optimizer_t0 = now
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        return None

    def optimizer_post(self, optimizer, args, kwargs):
        if self.is_compiling() or (self.only_optimizer is not None and id(optimizer) != self.only_optimizer):
            return None
        try:
            self.in_optimizer -= 1
            if self.in_optimizer == 0:
                self.tracker.optimizer_ended(id(optimizer), self.optimizer_t0, _native.now())
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        return None

    def wrap_zero_grad(self, original):
        inst = self

        def zero_grad(optimizer, *args, **kwargs):
            t0 = _native.now()
            try:
                return original(optimizer, *args, **kwargs)
            finally:
                if inst._on:
                    inst.tracker.optimizer_known(id(optimizer))
                    _native.span(FRAMEWORK, ZERO_GRAD, t0, _native.now())

        return zero_grad

    def wrap_optimizer_init(self, original):
        inst = self

        def __init__(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            if inst._on:
                inst.tracker.optimizer_known(id(optimizer))
                inst.roots.look_again()

        return __init__


def _timed_compiled_function(inst, compiled, name: str):
    """Forward and loss run inside a compiled function's graph, out of the hooks'
    sight. A call in which nothing else was observed (no phase ended inside) was
    a forward: it becomes one Forward span. One that ran a whole step with
    graph breaks (its backward and optimizer seen eagerly) is left alone, and
    run.json notes that its forward is not separated."""

    @functools.wraps(compiled)
    def call(*args, **kwargs):
        if inst.depth or not inst._on or inst.is_compiling():
            return compiled(*args, **kwargs)
        tracker = inst.tracker
        t0, seen = _native.now(), tracker.last_end
        result = compiled(*args, **kwargs)
        try:
            if tracker.last_end == seen and inst._on:
                mode = inst.guess_mode()
                tracker.forward_started(mode, t0)
                tracker.forward_ended(mode, t0, _native.now())
            elif inst._on and name not in inst.noted:
                inst.noted.add(name)
                session.add_note(f"torch.compile: {name} runs a whole step in its graph; its Forward and Loss "
                                 "are not separated (they show as Other)")
        except Exception as exc:  # noqa: BLE001
            inst.fail(exc)
        return result

    return call


def distributed_rank():
    """(rank, world size) of an initialised torch.distributed process group, or None."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None
