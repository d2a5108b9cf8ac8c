"""``GradScaler.step``: an iteration whose gradients overflowed is still a step.

With fp16 autocast the scaler skips ``optimizer.step()`` when it finds inf/NaN
gradients (several times while its scale settles at the start, then now and
then). The loop ran a whole iteration all the same, and the user's own counters
(Lightning's, Hugging Face's, their logs) count it: stepscope does too. A
skipped step is told to the tracker as an empty optimizer step of that
optimizer, its Optimizer phase the scaler's own time (unscaling, the inf check).
"""

from __future__ import annotations

from stepscope.core import recording


def install(ctx) -> None:
    scaler = getattr(getattr(ctx.torch, "amp", None), "GradScaler", None)
    if scaler is not None and callable(getattr(scaler, "step", None)):
        ctx.patch(scaler, "step", lambda original: _wrap_step(ctx, original))


def _wrap_step(ctx, original):
    now, loops, is_on = recording.now, ctx.loops, ctx.is_on

    def step(scaler, optimizer, *args, **kwargs):
        st = loops.local.s
        tracker, t0 = st.tracker, now()
        seen = tracker.last_end  # moves when an optimizer step of ours ends
        result = original(scaler, optimizer, *args, **kwargs)
        try:
            only = ctx.only_optimizer
            if (is_on() and tracker.last_end == seen and not st.depth and not st.in_optimizer
                    and (only is None or id(optimizer) == only)):
                tracker.optimizer_started(id(optimizer), t0)
                tracker.optimizer_ended(id(optimizer), t0, now())
        except Exception as exc:  # noqa: BLE001
            ctx.fail(exc)
        return result

    return step
