"""GetNextBottleneck: the training loop waits for its data."""

from __future__ import annotations

from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label


class GetNextBottleneck(Rule):
    name = "GetNextBottleneck"
    summary = "Share of train step time spent waiting for the next batch."
    params = {
        "threshold": Param(0.20, "ratio", "fire above this share of train step time in GetNext "
                                          "(XProf: > 20% highly input-bound, 5-20% moderately)"),
        "warmup_steps": Param(1, "steps", "first train steps of each rank left out (worker start-up)"),
    }

    def not_applicable(self, run):
        steps = run.steps
        if not (steps["mode"] == "train").any():
            return "no train steps"
        if not (run.phases["name"] == "GetNext").any():
            return "no GetNext phases (the loop does not read from an instrumented data loader)"
        return None

    def evaluate(self, run, p):
        out = []
        train = run.steps[run.steps["mode"] == "train"]
        for (process, rank), s in train.groupby(["process", "rank"], dropna=False, sort=True):
            s = s.sort_values("start_ns").iloc[int(p["warmup_steps"]):]
            total = s["duration_ns"].sum()
            if total <= 0 or not len(s):
                continue
            share = float(s["GetNext"].sum() / total)
            if share <= p["threshold"]:
                continue
            worst = s.nlargest(5, "GetNext")
            out.append(Finding(
                rule=self.name, rank=clean_rank(rank), severity="warning",
                message=(f"{rank_label(rank, process)} is input-bound: {100 * share:.0f}% of train step time "
                         f"waits for the next batch (GetNext {s['GetNext'].mean() / 1e6:.1f} ms of a "
                         f"{s['duration_ns'].mean() / 1e6:.1f} ms step on average)"),
                recommendation=("Feed the loop faster: raise DataLoader num_workers (and prefetch_factor), "
                                "use persistent_workers=True and pin_memory=True, move costly decoding or "
                                "augmentation out of __getitem__ (pre-process once, cache decoded data), or "
                                "read from faster storage."),
                evidence={"process": str(process), "getnext_share": round(share, 4),
                          "getnext_ms_mean": round(s["GetNext"].mean() / 1e6, 3),
                          "step_ms_mean": round(s["duration_ns"].mean() / 1e6, 3), "steps": int(len(s)),
                          "worst_steps": [{"step": int(r.step), "getnext_ms": round(r.GetNext / 1e6, 3)}
                                          for r in worst.itertuples()]}))
        return out
