"""Collectives: every one a process issues through torch.distributed, zero edits.

What is patched (each undone by ``uninstrument``):

* the collective functions (``all_reduce``, ``all_gather``, ``all_gather_single``,
  ``reduce_scatter``, ``reduce_scatter_single``, ``broadcast``, ``reduce``,
  ``all_to_all``, ``all_to_all_single``, ``gather``, ``scatter``, ``barrier``) under both
  their names (``torch.distributed`` and ``distributed_c10d``), and
  ``_broadcast_coalesced`` (DDP's parameter and buffer broadcasts). Deprecated aliases
  (``all_gather_into_tensor``, ``reduce_scatter_tensor``) call the wrapped ones. A call
  made inside another (``all_gather_object``'s) is recorded once, as the innermost
  collective that reaches the backend. Each wrapper is added to dynamo's table of
  collectives it rewrites, beside the original: a compiled function traces as before.
* ``Work.wait``: the time the caller blocks in it (a synchronous collective's call is
  such a wait as a whole: its own ``wait`` inside is not recorded again).
* ``Work.get_future``: where an async collective's completion is taken (below).
* DDP: the reducer's bucketed all-reduce is C++, seen by no Python function. A comm
  hook is registered when the model is built (or at its first forward, for a model
  built before stepscope started or unpickled), unless the program registered one
  (then its hook's own ``dist`` calls are recorded); the hook is torch's
  ``allreduce_hook``, which torch documents as giving DDP's results unchanged. A hook
  the program registers later takes its place inside stepscope's hook (DDP allows
  one). The last bucket's completion is the end of the wait DDP makes at the end of
  backward. A hook cannot be taken off a model, so this one outlives ``uninstrument``
  (it then records nothing), and so does the small guard on DDP's
  ``register_comm_hook`` that puts the program's hook inside it (for any other model
  the guard calls DDP's own).

Each collective is recorded as ``comm`` events (docs/format.md, "Collectives"): the
issuing call, its bytes and, for an async one, its completion. The completion costs the
issuing thread nothing until the program asks for it: an async work is kept (weakly)
until the program either waits for it (completed where ``wait`` returns: at once for
one already done) or takes its future (``get_future``, as DDP's hooks do: a callback on
that future, run on the backend's thread, is the completion). A work neither waited
for nor asked for counts as done where its call returned. Recording happens after the
call returns; a failure here turns stepscope off and the collective's result is the
caller's, as is.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Optional

from stepscope.core.recording import COMM, enabled, intern, now, span, span_counted
from stepscope.core.vocabulary import COMM_ASYNC, COMM_DDP, COMM_DONE, COMM_LAST_BUCKET, COMM_SEQ_BITS, COMM_WAIT
from stepscope.integrations._frameless import frameless

# function -> (kind, the parameter whose tensors' bytes are counted); the group and
# async_op parameters are found by name in the function's signature
FUNCTIONS = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
    "all_to_all_single": ("all_to_all", "input"),
    "gather": ("gather", "tensor"),
    "scatter": ("scatter", "tensor"),
    "barrier": ("barrier", None),
}
MAX_UNFINISHED = 4096  # works awaiting their wait (complete_at_wait): a program that never waits keeps no more
_DONE = COMM_DONE << COMM_SEQ_BITS  # an async collective's completion, in its arg
# deprecated aliases, wrapped only where the function they call is missing (older torch)
ALIASES = {"all_gather_into_tensor": "all_gather_single", "reduce_scatter_tensor": "reduce_scatter_single"}


def _bytes(tensors) -> int:
    try:
        return tensors.nbytes
    except AttributeError:
        pass
    if isinstance(tensors, (list, tuple)):
        return sum(_bytes(t) for t in tensors)
    return 0  # None, or not a tensor


class _Local(threading.local):
    inside = False  # in a recorded call (a collective made inside it is the same one)
    ddp = 0  # the flags of the DDP bucket being issued on this thread
    issued = None  # the bucket's last async collective: (work, name, t0, t1, done arg, wait id)


# A comm hook cannot be taken off a DDP model: what stepscope registered outlives an
# uninstrument(), and a later instrument() finds it here. One per process.
_LOCAL = _Local()
_HOOKED = weakref.WeakKeyDictionary()  # DDP module -> its _HookState (None: the program's hook, or none)
_OWN_HOOKS = weakref.WeakSet()  # DDP modules whose program registered a hook before stepscope could
_GUARDED = set()  # DDP classes whose register_comm_hook defers to stepscope's hook (never undone)


class _Group:
    """A process group's names and its collectives' count, in this process."""

    __slots__ = ("name", "seq", "ids")

    def __init__(self, name: str):
        self.name, self.seq, self.ids = name, 0, {}

    def name_id(self, kind: str) -> int:
        found = self.ids.get(kind)
        if found is None:
            found = self.ids[kind] = intern(f"{kind}@{self.name}")
        return found


class Collectives:
    """The recording side: wrappers of the collective functions, of ``Work.wait`` and
    the DDP hook. One per ``instrument()``."""

    def __init__(self, ctx, dist):
        self.ctx, self.dist = ctx, dist
        self.c10d = dist.distributed_c10d
        self.local = _LOCAL
        self.groups = {}  # group name -> _Group
        self.by_pg = {}  # id(process group) -> (weak reference to it, its _Group)
        self.wait_id = intern(COMM_WAIT)
        # id(work) -> (weak reference, name id, call start, call end, completion arg, wait id or -1)
        self.unfinished = {}
        world = getattr(self.c10d, "_world", None)  # the default group in one attribute read, where torch has it
        self.world = world if hasattr(type(world), "default_pg") else None
        self.hooked, self.own_hooks = _HOOKED, _OWN_HOOKS

    # --- the collective functions -------------------------------------------------------------
    def install(self) -> None:
        c10d, dist = self.c10d, self.dist
        for fname, (kind, tensor_param) in FUNCTIONS.items():
            original = getattr(c10d, fname, None)
            if original is None or (fname in ALIASES and hasattr(c10d, ALIASES[fname])):
                continue
            positions = _positions(original, tensor_param)
            if positions is None:
                continue  # a signature this version does not have: left alone
            wrapped = self.ctx.patch(c10d, fname, functools.partial(self.wrap, kind, positions))
            if getattr(dist, fname, None) is original:
                self.ctx.replace(dist, fname, wrapped)
            self._let_dynamo_rewrite(original, wrapped)
        coalesced = getattr(dist, "_broadcast_coalesced", None)
        if coalesced is not None:  # (process_group, tensors, buffer_size, src): blocking
            self.ctx.patch(dist, "_broadcast_coalesced",
                           functools.partial(self.wrap, "broadcast", (1, "tensors", 0, "process_group", -1, "")))
        work = getattr(c10d, "Work", None)
        if work is not None and callable(getattr(work, "wait", None)):
            self.ctx.patch(work, "wait", self.wrap_wait)
        if work is not None and callable(getattr(work, "get_future", None)):
            self.ctx.patch(work, "get_future", self.wrap_get_future)

    def _let_dynamo_rewrite(self, original, wrapped) -> None:
        """Dynamo rewrites a traced ``dist.all_reduce`` into its functional form by looking
        the function up in a table: the wrapper maps where the original does."""
        import sys

        fcol = sys.modules.get("torch.distributed._functional_collectives")
        remaps = getattr(fcol, "traceable_collective_remaps", None)
        if isinstance(remaps, dict) and original in remaps:
            remaps[wrapped] = remaps[original]

    def group_of(self, group) -> Optional[_Group]:
        """The group's record; None for a rank outside it (its call does nothing)."""
        if group is None:
            group = self.c10d._get_default_group() if self.world is None else self.world.default_pg
        known = self.by_pg.get(id(group))
        if known is not None and known[0]() is group:
            return known[1]
        name = getattr(group, "group_name", None)  # the same on every rank of the group
        if not name:
            return None
        name = str(name)
        found = self.groups.get(name)
        if found is None:
            found = self.groups[name] = _Group(name)
        try:
            self.by_pg[id(group)] = (weakref.ref(group), found)
        except TypeError:  # a group that takes no weak reference: looked up by name each time
            pass
        return found

    def wrap(self, kind, positions, original):
        tensor_at, tensor_kw, group_at, group_kw, async_at, async_kw = positions
        # Every name the call reads is a local here: the Python lines are what recording costs.
        local, ctx, wait_id, world, unfinished = self.local, self.ctx, self.wait_id, self.world, self.unfinished
        last = [None, None, None]  # (weak reference to the group of the last call, its _Group, the name id)
        # ctx.is_compiling(), inline (one call less on every collective); dynamo folds the first to True
        is_dynamo_compiling, compiler = ctx.is_dynamo_compiling, ctx.compiler
        ref = weakref.ref

        def collective(*args, **kwargs):
            if is_dynamo_compiling() or compiler._is_compiling_flag or local.inside or not enabled():
                return original(*args, **kwargs)
            local.inside = True
            t0 = now()
            try:
                result = original(*args, **kwargs)
            finally:
                local.inside = False
            try:  # recorded once the call returned: never in the collective's way
                n = len(args)
                pg = args[group_at] if n > group_at else kwargs.get(group_kw)
                if pg is None and world is not None:
                    pg = world.default_pg
                last_ref, group, name = last  # the group of this function's last call, and its name
                if last_ref is None or last_ref() is not pg:
                    group = self.group_of(pg)
                    if group is None:
                        return result
                    name = group.ids.get(kind) or group.name_id(kind)
                    try:
                        last[:] = ref(pg), group, name
                    except TypeError:  # (a group that takes no weak reference)
                        last[:] = None, None, None
                is_async = (args[async_at] if 0 <= async_at < n else kwargs.get(async_kw, False)) and result is not None
                group.seq += 1
                ddp = local.ddp
                flags = COMM_ASYNC | ddp if is_async else ddp
                arg = group.seq | flags << COMM_SEQ_BITS
                # The call's span ends here, with its bytes in the same native call: after the
                # look-ups above (a few hundred ns, against a collective's tens of us or more).
                if tensor_kw is not None:
                    tensors = args[tensor_at] if n > tensor_at else kwargs.get(tensor_kw)
                    try:
                        nbytes = tensors.nbytes
                    except AttributeError:  # a list of tensors, or None
                        nbytes = _bytes(tensors)
                    t1 = span_counted(COMM, name, t0, arg, nbytes)
                else:
                    t1 = now()
                    span(COMM, name, t0, t1, arg)
                if not is_async:
                    return result
                done = arg | _DONE
                if ddp:  # completed by the future the hook returns (_ddp_hook)
                    if local.issued is not None:  # (a hook of the program's that makes several)
                        self.pending(*local.issued)
                    local.issued = (result, name, t0, t1, done, wait_id if ddp & COMM_LAST_BUCKET else -1)
                    return result
                # kept until the program waits for it or takes its future (pending(), inline)
                if len(unfinished) >= MAX_UNFINISHED:
                    unfinished.clear()
                try:
                    unfinished[id(result)] = (ref(result), name, t0, t1, done, -1)
                except TypeError:  # a work that takes no weak reference: done where its call returned
                    pass
            except Exception as exc:  # noqa: BLE001 - the collective is the job's
                ctx.fail(exc)
            return result

        return collective

    def pending(self, work, name, t0, t1, done_arg, wait_id) -> None:
        """An async work, kept until the program waits for it or takes its future (the
        module's docstring); ``wait_id`` >= 0 for DDP's last bucket, whose completion ends
        the loop's wait from ``t1``."""
        unfinished = self.unfinished
        if len(unfinished) >= MAX_UNFINISHED:
            unfinished.clear()
        try:
            unfinished[id(work)] = (weakref.ref(work), name, t0, t1, done_arg, wait_id)
        except TypeError:  # a work that takes no weak reference: done where its call returned
            pass

    def wrap_wait(self, original):
        """Frameless (C): an error the wait raises (a timeout, a peer gone) has the traceback
        it has without stepscope. (The collective functions keep a Python wrapper: dynamo
        rewrites a traced ``dist.all_reduce`` only where it sees a Python function.)"""
        wait_id, local, unfinished = self.wait_id, self.local, self.unfinished

        def before(work, /, *args, **kwargs):
            if local.inside or not enabled():
                return None
            return (work, *args), kwargs, (work, now())

        def after(token, exc):  # (a wait that raised still blocked the loop until then)
            work, t0 = token
            t1 = now()
            span(COMM, wait_id, t0, t1)
            if unfinished:
                found = unfinished.pop(id(work), None)
                if found is not None and found[0]() is work:
                    span(COMM, found[1], found[2], t1, found[4])

        return frameless(original, before, after, fail=self.ctx.fail)

    def wrap_get_future(self, original):
        """A work whose future the program takes completes where that future does (a
        callback on the backend's thread): DDP's hooks wait on futures, not in ``wait``."""
        unfinished = self.unfinished

        def before(work, /, *args, **kwargs):
            if not unfinished:
                return None
            found = unfinished.pop(id(work), None)
            if found is None or found[0]() is not work:
                return None
            return (work, *args), kwargs, found

        def after(found, exc, future):
            ref, name, t0, t1, done, wait_id = found
            if exc is None:
                future.add_done_callback(functools.partial(_completed, name, t0, t1, done, wait_id))
                return
            work = ref()  # a backend without futures (gloo's point-to-point): done at its wait
            if work is not None:
                unfinished[id(work)] = found

        return frameless(original, before, after, fail=self.ctx.fail, with_result=True)

    # --- DDP ----------------------------------------------------------------------------------
    def install_ddp(self, ddp_class) -> None:
        self.ctx.patch(ddp_class, "__init__", self.wrap_init)
        self.ctx.patch(ddp_class, "_pre_forward", self.wrap_pre_forward)
        if ddp_class not in _GUARDED:
            # Not through the patch registry: once a model carries stepscope's hook, a hook the
            # program registers must go inside it even after stepscope is off (DDP takes one).
            # For every other model these call the original.
            _GUARDED.add(ddp_class)
            for name, wrap in (("register_comm_hook", _wrap_register),
                               ("_register_builtin_comm_hook", _wrap_register_builtin)):
                original = getattr(ddp_class, name, None)
                if original is not None:
                    setattr(ddp_class, name, functools.update_wrapper(wrap(original), original))

    def wrap_init(self, original):
        """The hook goes on when the model is built: outside any compiled frame (a
        ``torch.compile``d DDP model runs its forward inside dynamo, where nothing is
        registered). Frameless: DDP's own errors keep their traceback."""
        def before(module, /, *args, **kwargs):  # (DDP's own first argument is named module too)
            return (module, *args), kwargs, module

        def after(module, exc):
            if exc is None and module not in self.hooked:
                self.hook_ddp(module)

        return frameless(original, before, after, what="the torch integration's DDP hook failed")

    def wrap_pre_forward(self, original):
        inst = self

        def _pre_forward(module, /, *inputs, **kwargs):
            if module not in inst.hooked and not inst.ctx.is_compiling():
                try:
                    inst.hook_ddp(module)
                except Exception as exc:  # noqa: BLE001
                    inst.ctx.fail(exc)
            return original(module, *inputs, **kwargs)

        return _pre_forward

    def hook_ddp(self, module) -> None:
        reducer = getattr(module, "reducer", None)
        if (reducer is None or module in self.own_hooks or getattr(module, "_comm_hooks", None)
                or getattr(module, "_use_python_reducer", False) or getattr(module, "_ddp_stepscope_off", False)):
            self.hooked[module] = None  # the program's hook (or none possible): its dist calls are recorded
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        state = _HookState(default_hooks.allreduce_hook, module.process_group)
        try:
            self.dist._register_comm_hook(reducer, state, functools.partial(_ddp_hook, _LOCAL))
        except Exception:  # noqa: BLE001 - a hook registered unseen (on the reducer itself), an older torch
            self.hooked[module] = None
            return
        self.hooked[module] = state

class _HookState:
    """What stepscope's DDP hook calls: torch's allreduce hook, or the program's."""

    __slots__ = ("inner", "inner_state", "__weakref__")

    def __init__(self, inner, inner_state):
        self.inner, self.inner_state = inner, inner_state


def _wrap_register(original):
    def register_comm_hook(module, /, state, hook):
        ours = _HOOKED.get(module)
        if ours is None:
            _OWN_HOOKS.add(module)
            return original(module, state, hook)
        module._check_comm_hook(hook)
        ours.inner, ours.inner_state = hook, state  # DDP takes one hook: the program's runs inside ours
        module._comm_hooks.append((hook, state))
        return None

    return register_comm_hook


def _wrap_register_builtin(original):
    def _register_builtin_comm_hook(module, /, comm_hook_type):
        ours = _HOOKED.get(module)
        if ours is None:
            _OWN_HOOKS.add(module)
            return original(module, comm_hook_type)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        python_hook = {"ALLREDUCE": default_hooks.allreduce_hook,
                       "FP16_COMPRESS": default_hooks.fp16_compress_hook}.get(getattr(comm_hook_type, "name", ""))
        if python_hook is None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        ours.inner, ours.inner_state = python_hook, module.process_group
        return None

    return _register_builtin_comm_hook


def install(ctx) -> Optional[Collectives]:
    """Records torch.distributed's collectives (nothing where it is not built in); the
    recorder, which point-to-point and functional collectives share (``_p2p``, ``_funcol``)."""
    dist = getattr(ctx.torch, "distributed", None)
    if dist is None or not dist.is_available():
        return None
    collectives = Collectives(ctx, dist)
    collectives.install()
    from torch.nn.parallel import distributed as ddp

    collectives.install_ddp(ddp.DistributedDataParallel)
    return collectives


def _ddp_hook(local, state, bucket):
    """A bucket's all-reduce completes where the future the hook returns to DDP does (the
    reducer waits on it in C++): one callback on it, no ``get_future`` of stepscope's."""
    try:
        local.ddp = COMM_DDP | (COMM_LAST_BUCKET if bucket.is_last() else 0)
    except Exception:  # noqa: BLE001
        local.ddp = COMM_DDP
    try:
        future = state.inner(state.inner_state, bucket)
        issued = local.issued
        if issued is not None:
            try:
                future.add_done_callback(functools.partial(_completed, *issued[1:]))
            except Exception:  # noqa: BLE001 - not a torch future: done where its call returned
                pass
        return future
    finally:
        local.ddp, local.issued = 0, None


def _completed(name, t0, issued, arg, wait_id, future):
    """On the backend's thread, when an async collective completes."""
    try:
        span(COMM, name, t0, None, arg)
        if wait_id >= 0:  # DDP's last bucket: the loop waits from its issue to here
            span(COMM, wait_id, issued, None, 0)
    except Exception:  # noqa: BLE001 - a backend thread: nothing to report to
        pass


def _positions(function, tensor_param):
    """(tensor index, tensor name, group index, group name, async_op index, async_op name) in
    ``function``'s signature; None when it lacks one of them."""
    try:
        params = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None
    if "group" not in params or "async_op" not in params or (tensor_param and tensor_param not in params):
        return None
    tensor_at = params.index(tensor_param) if tensor_param else -1
    return tensor_at, tensor_param, params.index("group"), "group", params.index("async_op"), "async_op"
