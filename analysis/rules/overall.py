"""SageMaker Debugger's reporting rules: OverallSystemUsage (percentiles of every
system metric per node), OverallFrameworkMetrics (time per phase and per recorded
span, train and eval apart) and ProfilerReport (every rule, its parameters and how
often it fired). They never fire: their figures go to the summary's ``rule_details``."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.quantities import phase_shares
from stepscope.analysis.rules.base import Rule
from stepscope.analysis.store.frames import as_strings, split
from stepscope.core.vocabulary import OTHER

SPAN_CATEGORIES = ("framework", "annotation", "module", "op")  # what Debugger called framework metrics
TOP_SPANS = 30


class OverallSystemUsage(Rule):
    name = "OverallSystemUsage"
    summary = ("Per node and system metric (CPU, memory, disk, network, GPU; per device where there are several), "
               "p50, p95, p99, min and max over the whole run, in the metric's unit. Never fires; per-core CPU and "
               "per-process series are left out (they are in `stepscope.load(run).system`).")

    def not_applicable(self, run):
        return None if len(run.system) else "no system samples"

    def evaluate(self, run, p):
        return []

    def details(self, run, p):
        system = run.system
        system = system[~system["metric"].astype(str).str.startswith("proc_")
                        & ~system["device"].astype(str).str.fullmatch(r"cpu\d+")]
        out = {}
        for (node, metric, device), g in system.groupby(["node", "metric", "device"], sort=True, observed=True):
            v = g["value"].dropna().to_numpy(dtype=float)
            if not len(v):
                continue
            key = metric if str(device) in ("", "all", "None", "nan") else f"{metric} {device}"
            q = np.percentile(v, [50, 95, 99])
            out.setdefault(str(node), {})[key] = {
                "unit": str(g["unit"].iloc[0]), "p50": _r(q[0]), "p95": _r(q[1]), "p99": _r(q[2]),
                "min": _r(v.min()), "max": _r(v.max()), "samples": int(len(v))}
        return {"nodes": out}


def _r(x) -> float:
    return float(f"{float(x):.6g}")


def _span_modes(events: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """The mode of the step each event starts in (its process's steps), None outside steps."""
    out = pd.Series([None] * len(events), index=events.index, dtype=object)
    for process, s in steps.groupby("process", observed=True):
        s = s.sort_values("start_ns")
        mine = events[events["process"] == process]
        if mine.empty:
            continue
        t = mine["start_ns"].to_numpy()
        i = np.searchsorted(s["start_ns"].to_numpy(), t, side="right") - 1
        ok = (i >= 0) & (t < s["end_ns"].to_numpy()[np.clip(i, 0, len(s) - 1)])
        modes = np.where(ok, as_strings(s["mode"])[np.clip(i, 0, len(s) - 1)], None)
        out.loc[mine.index] = modes
    return out


class OverallFrameworkMetrics(Rule):
    name = "OverallFrameworkMetrics"
    summary = ("Time per phase (GetNext, Forward, Loss, Backward, Optimizer, Other) and per recorded span "
               "(framework, annotation, module and operator spans: Debugger's framework metrics), for train, eval "
               "and predict steps apart: count, total and share of that mode's step time (the summary's figures "
               "for the phases), the 30 longest spans per mode. Never fires.")

    def not_applicable(self, run):
        return None if len(run.steps) else "no steps"

    def evaluate(self, run, p):
        return []

    def details(self, run, p):
        steps = run.steps
        out = {}
        for mode, s in split(steps, "mode"):
            total = float(s["duration_ns"].sum())
            shares = phase_shares(s)
            other = float(s[OTHER].sum()) if OTHER in s else 0.0
            out[str(mode)] = {"steps": int(len(s)), "total_ms": round(total / 1e6, 3),
                              "phases": {**shares, OTHER: {"total_ms": round(other / 1e6, 3),
                                                           "share": round(other / total, 4) if total else 0.0}},
                              "spans": {}}
        spans = run.select(categories=SPAN_CATEGORIES, kinds=["span"])
        if len(spans) and len(steps):
            spans = spans.assign(mode=_span_modes(spans, steps)).dropna(subset=["mode"])
            agg = spans.groupby(["mode", "category", "name"], observed=True)["duration_ns"].agg(["count", "sum"])
            for (mode, category, name), row in agg.sort_values("sum", ascending=False).iterrows():
                entry = out.get(str(mode))
                if entry is None or len(entry["spans"]) >= TOP_SPANS or not row["count"]:
                    continue
                entry["spans"][f"{category}:{name}"] = {
                    "count": int(row["count"]), "total_ms": round(float(row["sum"]) / 1e6, 3),
                    "share": round(float(row["sum"]) / (entry["total_ms"] * 1e6), 4) if entry["total_ms"] else 0.0}
        return {"modes": out}


class ProfilerReport(Rule):
    name = "ProfilerReport"
    summary = ("Runs every rule, as SageMaker Debugger's ProfilerReport asked for the report: its details list "
               "each rule with the parameters it used, how many findings it gave, and the rules that passed or "
               "could not run (with why). `ProfilerReport.<Rule>_<param>=value` sets another rule's parameter, "
               "as in Debugger. `stepscope report` shows the same. Never fires.")

    def evaluate(self, run, p):
        return []

    @staticmethod
    def table(result: dict, counts: dict) -> dict:
        rows = []
        related = {}  # findings of a rule that another finding explains (relate.py)
        for f in result.get("related_findings", []):
            related[f["rule"]] = related.get(f["rule"], 0) + 1
        for rule, params in result["params"].items():
            if rule == ProfilerReport.name:
                continue
            reason = result["not_applicable"].get(rule)
            rows.append({"rule": rule, "status": "not applicable" if reason else
                         ("triggered" if counts.get(rule) else "passed"),
                         "triggered": int(counts.get(rule, 0)), "related": related.get(rule, 0),
                         "not_applicable": reason, "params": params})
        return {"rules": rows, "triggered": sorted(r["rule"] for r in rows if r["triggered"]),
                "passed": sorted(r["rule"] for r in rows if r["status"] == "passed")}
