"""HostSyncStall: the host blocks on the GPU in (nearly) every train step."""

from __future__ import annotations


from stepscope.analysis.rules.advice import advice, framework_of, sync_culprit
from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.gpudata import no_gpu_reason, train_steps
from stepscope.analysis.store.frames import groups

class HostSyncStall(Rule):
    name = "HostSyncStall"
    summary = ("In (nearly) every train step the host waits for the GPU in synchronizations (CUPTI "
               "synchronization records), so it cannot queue the next work ahead and the GPU drains.")
    params = {
        "threshold": Param(0.10, "ratio", "fire when the host spends more than this share of train step time "
                                          "blocked in synchronizations (a tenth of every step in which the host "
                                          "queues no work)..."),
        "min_step_share": Param(0.8, "ratio", "...with synchronizations in at least this share of the steps "
                                              "(every step, not an occasional checkpoint or evaluation)"),
        "warmup_steps": Param(2, "steps", "first train steps of each process left out"),
        "related_below": Param(0.05, "ratio", "what a synchronization costs is the time the GPU then idles "
                                              "until the host launches its next kernel (while the host waits, "
                                              "the GPU is busy); below this share of the step time, and with "
                                              "another finding on the same rank, the finding is listed as "
                                              "related to that one, not on its own (a deliberate per-step "
                                              ".item() in a job with another problem)"),
    }

    def not_applicable(self, run):
        if not (run.steps["mode"] == "train").any():
            return "no train steps"
        return no_gpu_reason(run, "trace")

    def evaluate(self, run, p):
        steps = train_steps(run, p["warmup_steps"])
        sync = run.sync
        sync = sync[sync["mode"] == "train"]
        out = []
        framework = None
        for (process, rank), s in groups(steps, ["process", "rank"]):
            y = sync[(sync["process"] == process) & sync["step"].isin(set(s["step"]))]
            total = float(s["duration_ns"].sum())
            if y.empty or total <= 0:
                continue
            share = float(y["duration_ns"].sum()) / total
            step_share = y["step"].nunique() / len(s)
            if share <= p["threshold"] or step_share < p["min_step_share"]:
                continue
            by_phase = y.groupby(y["phase"].fillna("Other"))["duration_ns"].sum().sort_values(ascending=False)
            by_api = y.groupby(y["launch_api"].fillna("unknown"))["duration_ns"].sum().sort_values(ascending=False)
            phase, api = str(by_phase.index[0]), str(by_api.index[0])
            per_step = y.groupby("step")["duration_ns"].sum()
            worst = per_step.nlargest(5)
            copies = run.memcpy
            copies = copies[(copies["process"] == process) & (copies["mode"] == "train")
                            & copies["step"].isin(set(s["step"])) & (copies["phase"] == phase)]
            dtoh = copies[copies["kind"] == "DtoH"]
            framework = framework or framework_of(run)
            drain_ms = float(y["gpu_idle_after_ns"].sum()) / len(s) / 1e6
            culprit = sync_culprit(framework, phase)
            out.append(Finding(
                rule=self.name, rank=clean_rank(rank), severity="warning",
                message=(f"{rank_label(rank, process)} blocks on the GPU every step: {100 * share:.0f}% of train "
                         f"step time is spent in synchronizations ({y['step'].nunique()} of {len(s)} steps, "
                         f"{per_step.mean() / 1e6:.1f} ms per step), mostly {api} in {phase}; the GPU then idles "
                         f"{drain_ms:.2f} ms per step until the next kernel is launched"),
                recommendation=f"In {phase}, look for {culprit}. {advice('sync', framework)}",
                evidence={"process": str(process), "framework": framework, "steps": int(len(s)),
                          "steps_with_sync": int(y["step"].nunique()),
                          "step_range": [int(s["step"].min()), int(s["step"].max())],
                          "sync_share": round(share, 4), "sync_ms_per_step": round(per_step.mean() / 1e6, 3),
                          "syncs_per_step": round(len(y) / len(s), 2), "phase": phase, "launch_api": api,
                          "sync_ms_by_phase": {str(k): round(v / 1e6, 3) for k, v in by_phase.items()},
                          "sync_ms_by_api": {str(k): round(v / 1e6, 3) for k, v in by_api.items()},
                          "kinds": {str(k): int(v) for k, v in y["kind"].value_counts().items()},
                          "dtoh_copies_in_phase_per_step": round(len(dtoh) / len(s), 2),
                          "gpu_idle_after_sync_ms_per_step": round(drain_ms, 3),
                          "step_ms_mean": round(total / len(s) / 1e6, 3),
                          "worst_steps": [{"step": int(st), "sync_ms": round(v / 1e6, 3)} for st, v in worst.items()]},
                cost_ms_per_step=drain_ms))
        return out

