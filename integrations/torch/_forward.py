"""Forward, Loss and Recompute as the roots' calls report them (``_roots.py``: the
native timed call, or discovery's hooks for a root's first call), and the mode of
a step: a framework loop's, else train or eval from grad mode and the models'
flags."""

from __future__ import annotations

from stepscope.core.recording import now
from stepscope.integrations._steps import FORWARD, LOSS, RECOMPUTE
from stepscope.integrations.torch._loops import LoopState


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


class Forwards:
    """The forwards of every thread's loop, reported to its tracker."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.torch = ctx.torch

    # --- modes ----------------------------------------------------------------------------
    def mode_of(self, module, st: LoopState) -> str:
        if st.forced_modes:
            return st.forced_modes[-1]
        return "train" if self.torch.is_grad_enabled() and is_training(module) else "eval"

    def guess_fetch_mode(self) -> str:
        """The mode of a fetched batch on which no work showed (the tracker asks)."""
        return self.guess_mode(self.ctx.loops.local.s)

    def guess_mode(self, st: LoopState) -> str:
        """A fetched batch's mode, before its forward shows it."""
        if st.forced_modes:
            return st.forced_modes[-1]
        if not self.torch.is_grad_enabled():
            return "eval"
        models = self.ctx.roots.models
        if not models or models[0].training:
            return "train"
        return "train" if any(is_training(m) for m in models) else "eval"

    # --- forward (called by the roots' timed calls) -------------------------------------------
    def root_pre(self, module, st: LoopState) -> None:
        roots = self.ctx.roots
        try:
            st.depth += 1
            if st.depth > 1:
                return
            if st.in_backward:
                st.stack.append((now(), "train", RECOMPUTE, None))
            elif roots.is_loss(module):
                st.stack.append((now(), "train", LOSS, None))
            else:
                if roots.stop_at_known is st and module is not st.pending_root:
                    roots.known_root_ran(st)
                mode = self.mode_of(module, st)
                t0 = now()
                # a part of one directly called forward (_roots.py): its group, and the part
                # named as the native path names it, by the root's timed call
                group = roots.group_of.get(module)
                part = None if group is None else (group, roots.timed[module][0])
                # acting (the native roots' flag): eval only because grad is off, the module training
                acting = not st.forced_modes and mode == "eval" and module.training
                st.tracker.forward_started(mode, t0, *(part or (None, None)), acting)
                st.stack.append((t0, mode, FORWARD, part))
        except Exception as exc:  # noqa: BLE001
            self.ctx.fail(exc)

    def root_post(self, st: LoopState) -> None:
        try:
            st.depth -= 1
            if st.depth > 0 or not st.stack:
                st.depth = max(st.depth, 0)
                return
            t0, mode, phase, part = st.stack.pop()
            t1 = now()
            if phase == LOSS:
                st.tracker.loss(t0, t1)
            elif part is not None:
                st.tracker.forward_ended(mode, t0, t1, phase, *part)
            else:
                st.tracker.forward_ended(mode, t0, t1, phase)
        except Exception as exc:  # noqa: BLE001
            self.ctx.fail(exc)

    # --- work that is no forward of a loop ----------------------------------------------------
    def hiding(self, original):
        """torch.jit.trace runs the model: no steps, no phases."""
        ctx = self.ctx

        def hidden_call(*args, **kwargs):
            st = ctx.loops.local.s
            st.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                st.depth = max(0, st.depth - 1)

        return hidden_call

    def wrap_train(self, original):
        """model.train()/eval() announce a loop, maybe of a model not seen yet (one
        loaded from disk): discovery looks again."""
        ctx = self.ctx

        def train(module, mode=True):
            if not ctx.is_on():
                return original(module, mode)
            st = ctx.loops.local.s
            if st.setting_mode:  # children of the module being set
                return original(module, mode)
            st.setting_mode = True
            try:
                if not st.depth and module not in ctx.roots.timed:
                    ctx.roots.look_again(until_known_root=True)
                return original(module, mode)
            finally:
                st.setting_mode = False

        return train
