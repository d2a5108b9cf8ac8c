"""GetNextBottleneck: the training loop waits for its data."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.quantities import (epoch_start_wait, loop_starts, ms, percent, phase_share,
                                          steady_phase_share, step_stats)
from stepscope.analysis.tables.pipeline import tfdata_stages
from stepscope.analysis.rules.advice import TENSORFLOW, TORCH, advice, framework_of
from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.dataloader import keeps_workers, per_fetch_ms
from stepscope.analysis.rules.gpudata import train_groups
from stepscope.analysis.rules.whatif import per_step_saving
from stepscope.core.vocabulary import COMPUTE_PHASES, GETNEXT, TRAIN


_EAGER_FETCH = ("A custom loop that fetches each batch in Python (for batch in dataset: step(batch)) pays an eager "
                "call per batch, more with a tf.distribute iterator: iterate inside the tf.function instead, several "
                "steps per call (next(iterator) in a tf.range loop, or the for loop over the dataset inside it), "
                "and give each step more work (a larger batch). ")


class GetNextBottleneck(Rule):
    name = "GetNextBottleneck"
    summary = ("Share of train step time spent waiting for the next batch: the summary's GetNext share, per rank "
               "(over every train step, as in the summary), when it stays above the threshold without the first "
               "steps and the last one too (worker start-up and shut-down alone are not an input-bound loop).")
    params = {
        "threshold": Param(0.20, "ratio", "fire above this share of train step time in GetNext "
                                          "(XProf: > 20% highly input-bound, 5-20% moderately)"),
        "warmup_steps": Param(1, "steps", "the share must exceed the threshold also without each rank's first "
                                          "train steps (worker start-up) and its last one (the exhausted "
                                          "iterator joins its workers); the finding quotes the share over all "
                                          "of them, the summary's"),
        "min_ms": Param(0.5, "ms", "...and the wait averages at least this long a fetch (a step with gradient "
                                   "accumulation fetches several batches): a smaller wait is the loader's own "
                                   "per-batch cost in the main process (collating tensors already in memory), which "
                                   "data-loader workers do not remove"),
        "epoch_start_s": Param(0.01, "s", "PyTorch: name the time persistent_workers=True would save when the "
                                          "first step of each epoch waits at least this much longer for its batch "
                                          "than the slowest tenth of the other steps"),
    }

    def not_applicable(self, run):
        steps = run.steps
        if not (steps["mode"] == TRAIN).any():
            return "no train steps"
        # (the steps' GetNext time answers without the phases table, but for GetNext spans outside every step)
        if not (steps[GETNEXT] > 0).any() and not len(run.select(categories=["phase"], kinds=["span"],
                                                                   names=[GETNEXT], columns=["name"])):
            return "no GetNext phases (the loop does not read from an instrumented data loader)"
        return None

    def evaluate(self, run, p):
        out = []
        steps = run.steps
        framework = None
        starts = None
        for (process, rank), s in train_groups(run):
            if not len(s) or s["duration_ns"].sum() <= 0:
                continue
            share = phase_share(s, GETNEXT)  # the summary's figure (SPEC §7)
            if share <= p["threshold"]:
                continue
            steady = steady_phase_share(s, GETNEXT, p["warmup_steps"])
            if steady <= p["threshold"]:
                continue  # start-up, not a loop that waits for its data
            if per_fetch_ms(run, process, s) < p["min_ms"]:
                continue  # (why_not_judged says so)
            if framework is None:
                framework = framework_of(run)
            epoch = None
            if framework == TORCH:
                if starts is None:
                    starts = loop_starts(run.select(categories=["step"], kinds=["instant"]), steps)
                mine = steps[steps["process"] == process]
                if not keeps_workers(run, process):  # (a loader that keeps them is not told to)
                    epoch = epoch_start_wait(mine, starts, p["epoch_start_s"])
            stats = step_stats(s)
            getnext_ms = ms(s[GETNEXT].mean())
            worst = s.nlargest(5, GETNEXT)
            recommendation = advice("feed", framework)
            if epoch is not None:
                recommendation = advice("epoch_start", TORCH, **epoch) + recommendation
            stage = _slowest_stage(run, process) if framework == TENSORFLOW else None
            if framework == TENSORFLOW and not (s[list(COMPUTE_PHASES)] > 0).any(axis=None):
                # a custom loop (no fit measured its compute): each batch fetched from Python
                recommendation = _EAGER_FETCH + recommendation
            if stage is not None:
                recommendation = (f"In the sampled steps tf.data's slowest stage is {stage['stage']} "
                                  f"({stage['self_ms_per_call']:.2f} ms a call, {percent(stage['share'])} of the "
                                  "pipeline's own time): speed that one up first. ") + recommendation
            evidence = {"process": str(process), "getnext_share": share, "getnext_share_after_warmup": steady,
                        "getnext_ms_mean": getnext_ms, "step_ms_mean": stats["mean_ms"], "steps": stats["count"],
                        "framework": framework,
                        "worst_steps": [{"step": int(r.step), "getnext_ms": ms(getattr(r, GETNEXT))}
                                        for r in worst.itertuples()]}
            if epoch is not None:
                evidence["epoch_start"] = epoch
            if stage is not None:
                evidence["tfdata_slowest_stage"] = stage
            out.append(Finding(
                rule=self.name, rank=clean_rank(rank), severity="warning",
                message=(f"{rank_label(rank, process)} is input-bound: {percent(share)} of train step time "
                         f"waits for the next batch (GetNext {getnext_ms:.1f} ms of a "
                         f"{stats['mean_ms']:.1f} ms step on average)"),
                recommendation=recommendation, evidence=evidence, cost_ms_per_step=getnext_ms,
                saving=_saving(run, process, s, p)))
        return out


    def why_not_judged(self, run, p):
        """A loop over the threshold whose wait per step is under the floor: its figures."""
        for (process, rank), s in train_groups(run):
            if not len(s) or s["duration_ns"].sum() <= 0:
                continue
            share = phase_share(s, GETNEXT)
            if share <= p["threshold"]:
                continue
            wait = per_fetch_ms(run, process, s)
            if wait < p["min_ms"]:
                return (f"{rank_label(rank, process)} waits for its batches {percent(share)} of train step time, but "
                        f"{wait:.2f} ms a batch: the loader's own per-batch cost in the main process, which workers "
                        f"would not remove (judged from {p['min_ms']:g} ms a batch)")
        return None


def _saving(run, process, steps, p):
    """What a loader that keeps up would save: each steady step's GetNext beyond the loader's
    own per-batch cost in the main process (handing a ready batch over: the smaller of
    ``min_ms`` a fetch and the steps' tenth-percentile wait), over the steps after the
    warm-up but the last (worker start-up, the exhausted iterator's shut-down)."""
    ordered = steps.sort_values("start_ns")
    steady = ordered.iloc[int(p["warmup_steps"]):len(ordered) - 1] if len(ordered) > int(p["warmup_steps"]) + 1 \
        else ordered
    waits = steady[GETNEXT].to_numpy(dtype=float) / 1e6
    fetches = max(float(steps[GETNEXT].sum()) / 1e6 / max(per_fetch_ms(run, process, steps), 1e-9) / len(steps), 1.0)
    own = min(float(np.percentile(waits, 10)), p["min_ms"] * fetches) if len(waits) else 0.0
    return per_step_saving(np.maximum(waits - own, 0.0), float(steps["duration_ns"].median()) / 1e6)


def _slowest_stage(run, process):
    """The tf.data stage with the most self time in this process's sampled windows, or None."""
    stages = tfdata_stages(run)
    mine = stages[stages["process"] == str(process)]
    total = mine["self_ms"].sum()
    if not len(mine) or total <= 0:
        return None
    top = mine.iloc[0]
    return {"stage": top["stage"], "path": top["path"], "calls": int(top["calls"]),
            "self_ms_per_call": float(top["self_ms_per_call"]), "share": float(top["self_ms"] / total)}
