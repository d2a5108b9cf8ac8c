"""Forward and Loss: timing the outermost modules without touching what users keep.

A root module (the model, a loss module) is timed through its per-instance
``_compiled_call_impl`` slot, the seam ``nn.Module.__call__`` consults before
anything else (``Module.compile()`` uses it). Unlike forward hooks it is
invisible to what users do with models: ``nn.Module.__getstate__`` drops it, and
where a subclass's own ``__getstate__`` keeps it (``DistributedDataParallel``'s) it
copies as None, so ``pickle``, ``copy.deepcopy`` and ``torch.save`` never carry it; TorchScript
and ``jit.trace`` are told to ignore it, and ``nn.DataParallel``'s replicas do
not copy it (``_instrumentor.py``); and the module keeps torch's no-hook fast
path, so a root costs one native call per forward (``csrc/torch/roots.cc``).

Roots are found by a pair of global forward hooks during the first steps
(removed after ``DISCOVERY_STEPS`` steps without a new root; back for a few
steps when a loop may begin with a new model: an optimizer is created, a
DataLoader not iterated before starts a pass, a framework loop starts, or a
step shows no forward). Global hooks make ``torch.compile`` warn and guard on
them, so the first ``torch.compile`` call ends discovery for good: compiled modules
are adopted as roots when compiled, and compiled code is timed from outside.

A program may call a model's method directly (``model.forward(x)``, a
LightningModule's ``training_step`` calling ``self.encoder`` and
``self.decoder``): the model is never called, its submodules are, and they are
the roots found. Their forwards, one after another, are then parts of one
Forward: they share a group token, and the step tracker writes one span from
the first part's start to the last one's end (``csrc/steps/reports.cc``). Found from
the calling frames, once, when such a root is adopted.
"""

from __future__ import annotations

import gc
import re
import sys
import time
import weakref

from stepscope.integrations._steps import FORWARD, RECOMPUTE
from stepscope.integrations.torch import _native_hooks
from stepscope.integrations.torch._forward import is_training


DISCOVERY_STEPS = 3  # steps without a new root before global discovery stops
# A thread that made an optimizer counts as a running loop until its first step ends, for
# at most this long: a thread that made one and trains nothing (it hands the model to
# another) must not keep the global hooks on.
SET_UP_NS = 2_000_000_000
# A criterion written as a plain nn.Module (timm's LabelSmoothingCrossEntropy, the
# FocalLoss and DiceLoss of countless repositories) is a loss by its class's name, when
# it trains no parameters of its own (a ModelWithLoss holds the model: a model).
_LOSS_NAME = re.compile(r"(Loss|Criterion)(?![a-z])|CrossEntropy$")


class _Group:
    """The token the roots inside one directly called forward share."""

    __slots__ = ()


class Roots:
    """The root modules of one process, and the discovery hooks that find them."""

    def __init__(self, ctx, fixed: bool):
        self.ctx = ctx
        self.torch = ctx.torch
        self.fixed = fixed  # instrument(model=...): no discovery
        self.timed = weakref.WeakKeyDictionary()  # module -> (our call, the slot's value before us)
        self.groups = weakref.WeakKeyDictionary()  # a module whose forward is called directly -> _Group
        self.group_of = weakref.WeakKeyDictionary()  # root -> its _Group
        self.model_refs = []  # weak references to the non-loss roots, for the fetch's mode guess
        self.models = []  # ...and those still alive (refreshed when one is adopted or dies)
        self.discovery = None
        self.quiet = {}  # id(loop state) -> its steps since a new root showed (a loop per thread)
        self.set_up = {}  # id(loop state) -> until when it counts as running before its first step
        self.compiled = False  # torch.compile was called: discovery is over for good
        # the loop (its state) whose next known root ends discovery (see look_again), or None
        self.stop_at_known = None
        from torch.nn.modules.loss import _Loss

        self.loss_type = _Loss
        self._loss_classes = weakref.WeakKeyDictionary()  # class -> is a loss (is_loss)
        skipped = []  # cannot carry Python timing, or compiler output
        for path in ("torch.fx.GraphModule", "torch.jit.ScriptModule"):
            module_name, _, cls = path.rpartition(".")
            try:
                skipped.append(getattr(__import__(module_name, fromlist=[cls]), cls))
            except Exception:  # noqa: BLE001
                pass
        self.skipped_types = tuple(skipped)
        from torch.nn.modules import module as module_mod

        self._module_mod = module_mod
        self._hooks = _GlobalHooks.of(module_mod, self.discover_pre, self.discover_post)

    def is_loss(self, module) -> bool:
        """A torch.nn loss, or a module without trainable parameters whose class is named
        as one (``FocalLoss``, ``LabelSmoothingCrossEntropy``): its forward is the Loss."""
        cls = type(module)
        if issubclass(cls, self.loss_type):
            return True
        named = self._loss_classes.get(cls)
        if named is None:
            named = self._loss_classes[cls] = any(
                _LOSS_NAME.search(c.__name__) for c in cls.__mro__ if c.__module__.split(".")[0] != "torch")
        return named and not any(p.requires_grad for p in module.parameters())

    # --- adopting a root ------------------------------------------------------------
    def adopt(self, module, group=None) -> None:
        if module in self.timed or isinstance(module, self.skipped_types):
            return
        if group is not None:
            self.group_of[module] = group
        before = module.__dict__.get("_compiled_call_impl")
        module.__dict__["_compiled_call_impl"] = self._timed_call(module, before)
        self.timed[module] = (module.__dict__["_compiled_call_impl"], before)
        if not self.is_loss(module):
            self.model_refs.append(weakref.ref(module, self._refresh_models))
            self._refresh_models()

    def rewrap(self, module) -> None:
        """Module.compile() replaced the slot: time the compiled call instead."""
        entry = self.timed.pop(module, None)
        if entry is not None and module.__dict__.get("_compiled_call_impl") is not entry[0]:
            compiled = module.__dict__.get("_compiled_call_impl")
            module.__dict__["_compiled_call_impl"] = self._timed_call(module, compiled)
            self.timed[module] = (module.__dict__["_compiled_call_impl"], compiled)
        elif entry is not None:
            self.timed[module] = entry
        else:
            self.adopt(module)

    def _timed_call(self, module, inner):
        """The root's call, timed (``csrc/torch/roots.cc``): no Python frame on the hot
        path of every step; the tracker is called once on each side of a forward
        and once after a loss. A weak reference: no cycle, the module's memory is
        freed when the user drops it."""
        ctx = self.ctx
        return _native_hooks.timed_root(
            ref=weakref.ref(module), inner=inner, call_impl=self.torch.nn.Module._call_impl, local=ctx.loops.local,
            roots=self, is_grad_enabled=self.torch.is_grad_enabled, is_training=is_training,
            compiler=ctx.compiler, fail=ctx.fail, loss=self.is_loss(module), phases=(FORWARD, RECOMPUTE),
            group=self.group_of.get(module))

    def group_for(self, module):
        """The group of a module called inside a model's method that the program (or a
        framework's loop) called directly, not through ``model(x)``, else None. Read
        from the frames above discovery's hook: past torch's ``__call__`` machinery,
        the outermost of the frames of modules' methods that called each other
        directly (``net.forward`` calling ``backbone.forward``)."""
        try:
            frame = sys._getframe(2)  # discover_pre's caller: torch's _call_impl
        except ValueError:
            return None
        machinery = self._module_mod.__file__
        while frame is not None and frame.f_code.co_filename == machinery:
            frame = frame.f_back
        owner = None
        while frame is not None and frame.f_code.co_argcount and frame.f_code.co_varnames[0] == "self":
            candidate = frame.f_locals.get("self")
            if not isinstance(candidate, self.torch.nn.Module) or self.is_loss(candidate):
                break
            owner, frame = candidate, frame.f_back
            if frame is not None and frame.f_code.co_filename == machinery:
                return None  # that method runs inside a call through __call__ (of a module passed over)
        if owner is None or owner is module or not any(m is module for m in owner.modules()):
            return None
        group = self.groups.get(owner)
        if group is None:
            group = self.groups[owner] = _Group()
        return group

    def release(self) -> None:
        """Puts every root's slot back as it was (uninstrument)."""
        self.stop_discovery()
        for module, (ours, before) in list(self.timed.items()):
            if module.__dict__.get("_compiled_call_impl") is ours:
                if before is None:
                    module.__dict__.pop("_compiled_call_impl", None)
                else:
                    module.__dict__["_compiled_call_impl"] = before
        self.timed = weakref.WeakKeyDictionary()

    def drop_from_replica(self, module, replica) -> None:
        """nn.DataParallel's replicas copy the module's ``__dict__``, our slot with
        it: it would call the original module from every device's thread. A replica
        gets the slot's value from before us."""
        entry = self.timed.get(module)
        if entry is not None and replica.__dict__.get("_compiled_call_impl") is entry[0]:
            if entry[1] is None:
                del replica.__dict__["_compiled_call_impl"]
            else:
                replica.__dict__["_compiled_call_impl"] = entry[1]

    def _refresh_models(self, _dead=None) -> None:
        self.model_refs = [ref for ref in self.model_refs if ref() is not None]
        self.models = [weakref.proxy(m) for m in (ref() for ref in self.model_refs) if m is not None]

    # --- discovery ----------------------------------------------------------------------
    def start_discovery(self) -> None:
        if self.discovery is None and not self.fixed and not self.compiled:
            self.discovery = self._hooks.install() if self._hooks is not None else (
                self._module_mod.register_module_forward_pre_hook(self.discover_pre),
                self._module_mod.register_module_forward_hook(self.discover_post, always_call=True))
            self.quiet = {}
            self.set_up = {}
            self._notify_every_step(True)

    def stop_discovery(self) -> None:
        if self.discovery is not None:
            for handle in self.discovery:
                handle.remove()
            self.discovery = None
            self._notify_every_step(False)

    def _notify_every_step(self, on: bool) -> None:
        """Without discovery, step_completed only acts after a step with no forward:
        the trackers (one per thread) then skip calling it after the others."""
        if self.ctx.loops is not None:
            for _, loop in list(self.ctx.loops.states):
                loop.tracker.every_step = on

    def look_again(self, until_known_root: bool = False) -> None:
        """A loop may begin with a model not seen yet (a new optimizer, a framework
        loop): discover for a few steps. ``until_known_root``: a weaker sign (a new
        pass over a DataLoader, model.train()): discovery ends as soon as a known
        root runs, so short epochs do not keep the global hooks on."""
        loop = self.ctx.loops.local.s
        if self.discovery is None:
            self.start_discovery()
            self.stop_at_known = loop if until_known_root else None
        else:
            self.quiet = {}
            if not (until_known_root and self.stop_at_known is loop):
                self.stop_at_known = None
        if not until_known_root and self.discovery is not None:
            # a thread setting up a model may wait (for data, a barrier) before its first
            # forward, while other loops step on: it runs a loop already (_all_quiet)
            self.set_up[id(loop)] = time.monotonic_ns() + SET_UP_NS

    def known_root_ran(self, loop) -> None:
        """A known root ran in ``loop``'s thread: the loop that looked again goes on
        with models already timed (another thread's roots say nothing of it)."""
        if self.stop_at_known is loop:
            self.stop_at_known = None
            self._stop_unless_a_call_is_pending()

    def _stop_unless_a_call_is_pending(self) -> None:
        """Stops discovery, unless a call it found is still running in another thread
        (between its pre and post hooks): with the hooks gone, that thread would never
        see the call end and would count everything after it as nested in it. A later
        step stops discovery then."""
        for _, loop in list(self.ctx.loops.states):
            if loop.pending_root is not None:
                return
        self.stop_discovery()

    def adopt_compiled_before(self) -> bool:
        """Modules ``torch.compile`` returned before stepscope was instrumented (an
        explicit ``instrument()`` after compiling) are roots, and discovery does not
        start: its global hooks would make each of them warn, and dynamo would trace
        them inside the compiled forward. Found once, by a scan of the heap
        (gc.get_objects: 29 ms for 290k objects here), and only where dynamo is loaded."""
        eval_frame = sys.modules.get("torch._dynamo.eval_frame")
        optimized = getattr(eval_frame, "OptimizedModule", None)
        if optimized is None:
            return False
        found = [o for o in gc.get_objects() if issubclass(type(o), optimized)]  # type(): no __class__ read
        for module in found:
            self.adopt(module)
        if found:
            self.compiled = True
        return bool(found)

    def compile_called(self) -> None:
        """torch.compile in use: no more global hooks (they warn and add guards)."""
        self.compiled = True
        self.stop_discovery()

    def step_completed(self, had_forward: bool) -> None:
        """Called on the thread of the loop whose step ended. Discovery ends once
        every loop running (one per thread) had a few steps without a new root."""
        if had_forward and self.discovery is None:
            return  # the common case: nothing to look for
        me = id(self.ctx.loops.local.s)
        if self.set_up:
            self.set_up.pop(me, None)
        if not had_forward:
            if self.compiled and self.discovery is None and not self.fixed:
                return
            self.start_discovery()
            self.stop_at_known = None  # a model not timed yet ran a whole step
            self.quiet[me] = 0
        elif self.discovery is not None:
            self.quiet[me] = self.quiet.get(me, 0) + 1
            if self.quiet[me] >= DISCOVERY_STEPS and self._all_quiet():
                self._stop_unless_a_call_is_pending()

    def _all_quiet(self) -> bool:
        """Every loop running had its quiet steps. A loop runs from its first fetch on:
        a thread inside the first fetch of its pass (another thread's steps go on
        meanwhile) has no step yet, and its first forward comes next. So does a thread
        that made an optimizer and has not stepped yet (look_again)."""
        now = time.monotonic_ns() if self.set_up else 0
        for _, loop in self.ctx.loops.states:
            tracker = loop.tracker
            running = tracker.mode is not None or tracker.pending is not None \
                or loop.fetch_t0 or loop.iter_started is not None or self.set_up.get(id(loop), 0) > now
            if running and self.quiet.get(id(loop), 0) < DISCOVERY_STEPS:
                return False
        return True

    def discover_pre(self, module, args):
        ctx = self.ctx
        if ctx.is_dynamo_compiling() or ctx.compiler._is_compiling_flag:
            return None  # first: dynamo, tracing this hook, must not see stepscope's state
        loop = ctx.loops.local.s
        if loop.depth or loop.pending_root is not None:
            return None
        try:
            if module in self.timed or isinstance(module, self.skipped_types):
                return None
            self.adopt(module, None if self.is_loss(module) else self.group_for(module))
            loop.pending_root = module
            if self.discovery is None:  # stopped by another thread meanwhile: no post hook will come
                loop.pending_root = None
                return None
            ctx.forwards.root_pre(module, loop)  # this call started before the module was a root
            self.quiet[id(loop)] = 0
        except Exception as exc:  # noqa: BLE001
            ctx.fail(exc)
        return None

    def discover_post(self, module, args, output):
        ctx = self.ctx
        if ctx.is_dynamo_compiling() or ctx.compiler._is_compiling_flag:
            return None
        loop = ctx.loops.local.s
        if module is loop.pending_root:
            loop.pending_root = None
            try:
                ctx.forwards.root_post(loop)
            except Exception as exc:  # noqa: BLE001
                ctx.fail(exc)
        return None


class _GlobalHooks:
    """The discovery hooks put into (and taken out of) torch's global hook dicts
    directly: what ``register_module_forward_(pre_)hook`` do, without a new
    ``RemovableHandle`` each time: those cost ~20 us a time inside a training loop,
    and discovery comes back at every new loop."""

    KEY = -0x57E95C0  # torch's handle ids count up from 0: never one of theirs

    def __init__(self, pre_hooks, hooks, always_called, pre, post):
        self.pre_hooks, self.hooks, self.always_called = pre_hooks, hooks, always_called
        self.pre, self.post = pre, post
        self.handles = (self,)

    @classmethod
    def of(cls, module_mod, pre, post):
        dicts = [getattr(module_mod, name, None) for name in
                 ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_always_called")]
        if any(not isinstance(d, dict) for d in dicts):
            return None  # another torch: the public functions
        return cls(*dicts, pre, post)

    def install(self):
        self.pre_hooks[self.KEY] = self.pre
        self.hooks[self.KEY] = self.post
        self.always_called[self.KEY] = True
        return self.handles

    def remove(self) -> None:
        for d in (self.pre_hooks, self.hooks, self.always_called):
            d.pop(self.KEY, None)
