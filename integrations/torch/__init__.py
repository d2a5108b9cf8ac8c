"""PyTorch: phases and steps from global hooks, with no edits to the script.

    stepscope.integrations.torch.instrument()        # idempotent; uninstrument() undoes it

What is hooked (all public or long-stable torch entry points):

* GetNext   ``_BaseDataLoaderIter.__next__`` (single- and multi-process loaders)
* Forward   per-instance hooks on the *outermost* modules only. A global
            forward pre-hook discovers them during the first steps and is then
            removed (global hooks slow every module call by ~2 us); it comes
            back when a step shows work but no forward (a new model).
* Loss      outermost ``nn.modules.loss._Loss`` modules and the functional losses
            of ``torch.nn.functional`` called outside a module; otherwise the
            time between the end of Forward and the start of Backward.
* Backward  ``torch.autograd.backward`` and ``.grad`` (``Tensor.backward`` calls
            the former), and ``torch.autograd._engine_run_backward`` behind them
            for any other caller; nested calls count once. Forwards that run
            inside it (activation checkpointing) are ``Recompute``.
* Optimizer the global optimizer step pre/post hooks; ``zero_grad`` is recorded
            as a framework annotation. Forward/backward inside ``step()``
            (LBFGS closures) nest inside Optimizer; analysis counts time once.

Under ``torch.compile`` every hook returns at once while dynamo traces
(``torch.compiler.is_compiling()``), so no graph breaks are added; compiled
modules are timed from outside (``OptimizedModule`` is an ordinary root, and
``Module.compile()`` is wrapped so in-place compiled modules still report).
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Optional

from stepscope.core import _native, runinfo, safety, session
from stepscope.integrations._steps import FORWARD, LOSS, RECOMPUTE, StepTracker

__all__ = ["instrument", "uninstrument", "is_instrumented"]

FRAMEWORK = _native.CATEGORIES.index("framework")
ZERO_GRAD = _native.intern("Optimizer.zero_grad")
DISCOVERY_STEPS = 3  # steps without a new root before global discovery stops

FUNCTIONAL_LOSSES = (
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_embedding_loss", "cross_entropy",
    "ctc_loss", "gaussian_nll_loss", "hinge_embedding_loss", "huber_loss", "kl_div", "l1_loss",
    "margin_ranking_loss", "mse_loss", "multi_margin_loss", "multilabel_margin_loss",
    "multilabel_soft_margin_loss", "nll_loss", "poisson_nll_loss", "smooth_l1_loss", "soft_margin_loss",
    "triplet_margin_loss", "triplet_margin_with_distance_loss",
)


class _Instrumentation:
    """Everything instrument() changed, so uninstrument() can undo it exactly."""

    def __init__(self, torch, model=None, optimizer=None):
        self.torch = torch
        self.tracker = StepTracker(on_new_step=self.step_completed)
        self.only_optimizer = None if optimizer is None else id(optimizer)
        self.fixed_roots = model is not None
        self.roots = weakref.WeakKeyDictionary()  # module -> hook handles
        self.patches = []  # (owner, attribute, original)
        self.handles = []
        self.discovery = None
        self.quiet_steps = 0
        self.depth = 0  # root forwards in progress
        self.in_backward = 0
        self.in_optimizer = 0
        self.stack = []  # (t0, mode, phase) of open root forwards
        self.model_refs = []  # weak references to the non-loss roots, for guess_mode
        self.forced_modes = []  # a framework loop that knows its mode (Keras fit/evaluate/predict)
        self.is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        from torch.nn.modules.loss import _Loss

        self.loss_type = _Loss
        # Modules that cannot carry Python hooks or are compiler output: not roots.
        skipped = []
        for path in ("torch.fx.GraphModule", "torch.jit.ScriptModule"):
            module_name, _, cls = path.rpartition(".")
            try:
                skipped.append(getattr(__import__(module_name, fromlist=[cls]), cls))
            except Exception:  # noqa: BLE001
                pass
        self.skipped_types = tuple(skipped)

    # --- failures: report once, undo everything, let the job run on ---------------
    def fail(self, exc: BaseException) -> None:
        safety.report_failure("the PyTorch integration failed", exc)
        try:
            uninstrument()
        except Exception:  # noqa: BLE001
            pass

    # --- patching helpers ---------------------------------------------------------
    def patch(self, owner, name: str, make_wrapper) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        wrapper = make_wrapper(original)
        functools.update_wrapper(wrapper, original)  # keeps __module__/__qualname__: pickling by reference
        wrapper.__stepscope_original__ = original
        setattr(owner, name, wrapper)
        self.patches.append((owner, name, original))

    def install(self, model=None) -> None:
        torch = self.torch
        from torch.utils.data import dataloader

        self.patch(dataloader._BaseDataLoaderIter, "__next__", self.wrap_next)
        # The public entry points (Tensor.backward calls torch.autograd.backward), so
        # Backward includes building the initial gradient; the engine entry catches
        # any other caller. Nested calls are counted once.
        self.patch(torch.autograd, "backward", self.wrap_backward)
        self.patch(torch.autograd, "grad", self.wrap_backward)
        if hasattr(torch.autograd, "_engine_run_backward"):
            self.patch(torch.autograd, "_engine_run_backward", self.wrap_backward)
        from torch.optim import optimizer as optim_mod

        self.handles.append(optim_mod.register_optimizer_step_pre_hook(self.optimizer_pre))
        self.handles.append(optim_mod.register_optimizer_step_post_hook(self.optimizer_post))
        self.patch(optim_mod.Optimizer, "zero_grad", self.wrap_zero_grad)
        self.patch(optim_mod.Optimizer, "__init__", self.wrap_optimizer_init)
        for name in FUNCTIONAL_LOSSES:
            self.patch(torch.nn.functional, name, self.wrap_functional_loss)
        if hasattr(torch.nn.Module, "compile"):
            self.patch(torch.nn.Module, "compile", self.wrap_module_compile)
        if model is not None:
            self.adopt(model)
        else:
            self.start_discovery()
        session.on_stop(_close_steps)
        runinfo.register_rank_provider(_distributed_rank)

    def uninstall(self) -> None:
        self.stop_discovery()
        for handle in self.handles:
            handle.remove()
        for module, handles in list(self.roots.items()):
            for h in handles:
                h.remove()
            if getattr(module, "_stepscope_compiled", None) is not None:
                module._compiled_call_impl = module._stepscope_compiled
                del module._stepscope_compiled
        self.roots = weakref.WeakKeyDictionary()
        for owner, name, original in reversed(self.patches):
            setattr(owner, name, original)
        self.patches.clear()
        self.handles.clear()

    # --- root discovery -----------------------------------------------------------
    def start_discovery(self) -> None:
        if self.discovery is None and not self.fixed_roots:
            from torch.nn.modules import module as module_mod

            self.discovery = module_mod.register_module_forward_pre_hook(self.discover)
            self.quiet_steps = 0

    def stop_discovery(self) -> None:
        if self.discovery is not None:
            self.discovery.remove()
            self.discovery = None

    def discover(self, module, args):
        if self.is_compiling():
            return None
        try:
            if self.depth or module in self.roots or isinstance(module, self.skipped_types):
                return None
            self.adopt(module)
            self.root_pre(module, args)  # this call started before its own hook existed
            self.quiet_steps = 0
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        return None

    def adopt(self, module) -> None:
        if module in self.roots or isinstance(module, self.skipped_types):
            return
        self.roots[module] = (module.register_forward_pre_hook(self.root_pre),
                              module.register_forward_hook(self.root_post, always_call=True))
        if not isinstance(module, self.loss_type):
            self.model_refs.append(weakref.ref(module))

    @property
    def models(self):
        return [ref() for ref in self.model_refs]

    def step_completed(self, had_forward: bool) -> None:
        """Discovery runs until DISCOVERY_STEPS steps pass with no new root, and
        comes back when a step shows no forward (a model it does not know)."""
        if not had_forward:
            self.start_discovery()
        elif self.discovery is not None:
            self.quiet_steps += 1
            if self.quiet_steps >= DISCOVERY_STEPS:
                self.stop_discovery()

    # --- forward ------------------------------------------------------------------
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

    def root_pre(self, module, args):
        if self.is_compiling():
            return None
        try:
            self.depth += 1
            if self.depth > 1:
                return None
            if self.in_backward:
                self.stack.append((_native.now(), "train", RECOMPUTE))
                return None
            if isinstance(module, self.loss_type):
                self.stack.append((_native.now(), "train", LOSS))
                return None
            mode = self.mode_of(module)
            now = _native.now()
            self.tracker.forward_started(mode, now)
            self.stack.append((now, mode, FORWARD))
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        return None

    def root_post(self, module, args, output):
        if self.is_compiling():
            return None
        try:
            self.depth -= 1
            if self.depth > 0 or not self.stack:
                self.depth = max(self.depth, 0)
                return None
            t0, mode, phase = self.stack.pop()
            t1 = _native.now()
            if phase == LOSS:
                self.tracker.loss(t0, t1)
            else:
                self.tracker.forward_ended(mode, t0, t1, phase)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        return None

    def wrap_module_compile(self, original):
        inst = self

        def compile(module, *args, **kwargs):
            result = original(module, *args, **kwargs)
            try:
                compiled = module._compiled_call_impl
                if compiled is not None and getattr(module, "_stepscope_compiled", None) is None:
                    module._stepscope_compiled = compiled

                    def timed_call(*a, **kw):
                        if inst.is_compiling() or inst.depth:
                            return compiled(*a, **kw)
                        inst.root_pre(module, a)
                        try:
                            return compiled(*a, **kw)
                        finally:
                            inst.root_post(module, a, None)

                    module._compiled_call_impl = timed_call
                    inst.roots.setdefault(module, ())
            except Exception as exc:  # noqa: BLE001
                inst.fail(exc)
            return result

        return compile

    # --- GetNext ------------------------------------------------------------------
    def guess_mode(self) -> str:
        """A fetched batch's mode, before its forward shows it: grad mode, and
        whether any known model is in training mode (model.train()/eval())."""
        if self.forced_modes:
            return self.forced_modes[-1]
        if not self.torch.is_grad_enabled():
            return "eval"
        models = [m for m in self.models if m is not None]
        return "train" if not models or any(self.is_training(m) for m in models) else "eval"

    def wrap_next(self, original):
        inst = self

        def __next__(loader_iter):
            t0 = _native.now()
            try:
                batch = original(loader_iter)
            except StopIteration:
                try:
                    inst.tracker.exhausted(t0)
                except Exception as exc:  # noqa: BLE001
                    inst.fail(exc)
                raise
            try:
                if not inst.depth:
                    inst.tracker.fetched(t0, _native.now(), inst.guess_mode())
            except Exception as exc:  # noqa: BLE001
                inst.fail(exc)
            return batch

        return __next__

    # --- losses -------------------------------------------------------------------
    def wrap_functional_loss(self, original):
        inst = self

        def loss(*args, **kwargs):
            if inst.depth or inst.is_compiling():
                return original(*args, **kwargs)
            t0 = _native.now()
            inst.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                inst.depth -= 1
                try:
                    inst.tracker.loss(t0, _native.now())
                except Exception as exc:  # noqa: BLE001
                    inst.fail(exc)

        return loss

    # --- backward -----------------------------------------------------------------
    def wrap_backward(self, original):
        inst = self

        def backward(*args, **kwargs):
            if inst.in_backward or inst.is_compiling():
                return original(*args, **kwargs)
            t0 = _native.now()
            try:
                if not inst.depth and not inst.in_optimizer:
                    inst.tracker.backward_started(t0)
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

    # --- optimizer ----------------------------------------------------------------
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
                inst.tracker.optimizer_known(id(optimizer))
                _native.span(FRAMEWORK, ZERO_GRAD, t0, _native.now())

        return zero_grad

    def wrap_optimizer_init(self, original):
        inst = self

        def __init__(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            inst.tracker.optimizer_known(id(optimizer))

        return __init__


_active: Optional[_Instrumentation] = None


def instrument(model=None, optimizer=None) -> bool:
    """Hooks PyTorch (SPEC §1). Idempotent; returns True when instrumented.

    model: time only this module's forward (no global discovery hooks).
    optimizer: record only this optimizer's steps.
    Imports torch: call it when torch is in use.
    """
    global _active
    if _active is not None:
        return True
    try:
        import torch
    except ImportError as exc:
        raise ImportError("stepscope.integrations.torch needs PyTorch: pip install torch") from exc
    inst = _Instrumentation(torch, model=model, optimizer=optimizer)
    try:
        inst.install(model)
    except Exception as exc:  # noqa: BLE001 - an unknown torch version must not break the job
        inst.uninstall()
        safety.report_failure(f"cannot instrument torch {getattr(torch, '__version__', '?')}", exc)
        return False
    _active = inst
    return True


def uninstrument() -> None:
    """Removes every hook and patch instrument() installed."""
    global _active
    inst, _active = _active, None
    if inst is not None:
        inst.tracker.close()
        inst.uninstall()


def is_instrumented() -> bool:
    return _active is not None


def _distributed_rank():
    """(rank, world size) of an initialised torch.distributed process group, or None."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _close_steps() -> None:
    if _active is not None:
        _active.tracker.close()


def _on_import(torch_module) -> None:
    """Zero-edit mode: called right after `import torch` (see core.autostart)."""
    instrument()
