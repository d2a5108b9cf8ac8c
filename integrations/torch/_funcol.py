"""Functional collectives (``torch.distributed._functional_collectives``): what DTensor,
tensor and sequence parallelism and FSDP2's ``clip_grad_norm_``/``full_tensor()`` use,
zero edits, once that module is imported.

Each function (``all_reduce``, ``all_gather_*``, ``reduce_scatter_*``,
``all_to_all_single*``, ``broadcast``, ``permute_tensor``, the ``*_coalesced`` ones)
issues its collective and returns at once, its result an ``AsyncCollectiveTensor``
that waits (``wait_tensor``) where it is first used. So the call is recorded as an
async collective numbered in its process group beside the ``torch.distributed`` ones
(every rank issues a group's collectives in one order, whichever API), and its
completion is measured lazily: where ``wait_tensor`` returns for its result, the time
in ``wait_tensor`` being blocked time. A result never waited for has no completion
(it counts as done when its call returned); an alias of the result (DTensor's) waits for
it too. While dynamo, fake tensors or a proxy
trace, nothing is recorded: the collective then belongs to a compiled graph, which
no Python wrapper sees (docs/design.md, "Communication").
"""

from __future__ import annotations

import functools
import inspect

from stepscope.core.recording import COMM, counter, enabled, now, span
from stepscope.core.vocabulary import COMM_ASYNC, COMM_DONE, COMM_SEQ_BITS
from stepscope.integrations.torch._collectives import _bytes, _Group

MODULE = "torch.distributed._functional_collectives"
KINDS = {"all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
         "all_gather_single": "all_gather", "all_gather_single_autograd": "all_gather",
         "all_gather_tensor": "all_gather", "all_gather_tensor_autograd": "all_gather",
         "all_gather_into_tensor_coalesced": "all_gather", "all_gather_single_coalesced": "all_gather",
         "reduce_scatter_single": "reduce_scatter", "reduce_scatter_single_autograd": "reduce_scatter",
         "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_autograd": "reduce_scatter",
         "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_single_coalesced": "reduce_scatter",
         "all_to_all_single": "all_to_all", "all_to_all_single_autograd": "all_to_all",
         "broadcast": "broadcast", "permute_tensor": "permute"}
MAX_PENDING = 4096  # results awaiting their wait: a program that never waits keeps no more


class Functional:
    def __init__(self, collectives, module):
        self.c, self.module = collectives, module
        # the storage of a result awaiting its wait -> (name id, call start, arg); a storage freed
        # before its wait is taken by the next collective's result before anything waits on it
        self.pending = {}
        self.tracing = getattr(module, "_are_we_tracing", None)
        self.group_name = getattr(module, "_resolve_group_name", None)

    def install(self) -> None:
        if self.group_name is None:
            return  # a version without the name resolution this relies on: not recorded
        module, patch = self.module, self.c.ctx.patch
        for fname, kind in KINDS.items():
            original = getattr(module, fname, None)
            if original is None:
                continue
            try:
                params = list(inspect.signature(original).parameters)
            except (TypeError, ValueError):
                continue
            if "group" not in params:
                continue
            at = params.index("group"), params.index("tag") if "tag" in params else -1
            patch(module, fname, functools.partial(self.wrap, kind, at))
        if callable(getattr(module, "wait_tensor", None)):
            patch(module, "wait_tensor", self.wrap_wait)

    def _group(self, group, tag) -> _Group:
        name = str(self.group_name(group, tag))
        found = self.c.groups.get(name)
        if found is None:
            found = self.c.groups[name] = _Group(name)
        return found

    def wrap(self, kind, at, original):
        local, ctx = self.c.local, self.c.ctx
        group_at, tag_at = at

        def functional(*args, **kwargs):
            # (compiling first: dynamo folds it to True, and traces nothing of stepscope's)
            if ctx.is_compiling() or local.inside or not enabled() or (self.tracing and self.tracing()):
                return original(*args, **kwargs)
            local.inside = True
            t0 = now()
            try:
                result = original(*args, **kwargs)
            finally:
                local.inside = False
            try:
                t1 = now()
                n = len(args)
                group = args[group_at] if n > group_at else kwargs.get("group")
                tag = args[tag_at] if 0 <= tag_at < n else kwargs.get("tag", "")
                g = self._group(group, tag)
                g.seq += 1
                name, arg = g.name_id(kind), g.seq | COMM_ASYNC << COMM_SEQ_BITS
                span(COMM, name, t0, t1, arg)
                counter(COMM, name, _bytes(args[0] if args else kwargs.get("self")), arg, t0)
                self._await(result, name, t0, arg)
            except Exception as exc:  # noqa: BLE001 - the collective is the job's
                ctx.fail(exc)
            return result

        return functional

    def _await(self, result, name, t0, arg) -> None:
        pending = self.pending
        if len(pending) >= MAX_PENDING:
            pending.clear()
        for r in result if isinstance(result, (list, tuple)) else (result,):
            elem = getattr(r, "elem", None)  # an AsyncCollectiveTensor waits on its elem...
            if elem is not None:  # ...or on an alias of it (DTensor's): known by its storage
                pending[elem.untyped_storage().data_ptr()] = (name, t0, arg)

    def wrap_wait(self, original):
        pending, wait_id, ctx = self.pending, self.c.wait_id, self.c.ctx

        def wait_tensor(tensor):
            if ctx.is_compiling() or not pending or not enabled():
                return original(tensor)
            t0 = now()
            out = original(tensor)
            try:
                t1 = now()
                span(COMM, wait_id, t0, t1)
                found = pending.pop(tensor.untyped_storage().data_ptr(), None)
                if found is not None:
                    name, start, arg = found
                    span(COMM, name, start, t1, arg | COMM_DONE << COMM_SEQ_BITS)
            except Exception as exc:  # noqa: BLE001
                self.c.ctx.fail(exc)
            return out

        return wait_tensor


def install(collectives) -> None:
    """Records the functional collectives from the moment their module is imported."""
    from stepscope.core import importhook

    def imported(module):
        if collectives.ctx.is_on():
            Functional(collectives, module).install()

    importhook.when_imported(MODULE, imported)
