"""What changed between two runs (``stepscope diff RUN_A RUN_B``): step time, phase shares,
system use and findings side by side."""

from __future__ import annotations

from stepscope.analysis.rules.base import SEVERITIES, at_or_above
from stepscope.analysis.rules.whatif import difference_of_means
from stepscope.analysis.report.summary import summarize
from stepscope.analysis.run import Run, load
from stepscope.core.vocabulary import PHASES, TRAIN

#: A median step time this many percent above the baseline's is a regression (``--max-regression``).
MAX_REGRESSION_PERCENT = 10.0


def _pct_change(a, b):
    if a in (None, 0) or b is None:
        return None
    return round(100.0 * (b - a) / a, 1)


def diff(run_a, run_b, params=None, max_regression=None) -> dict:
    """max_regression: percent; a mode's median step time of run_b above run_a's by more is a
    regression (severity error, listed under ``regressions``)."""
    limit = MAX_REGRESSION_PERCENT if max_regression is None else float(max_regression)
    run_a = run_a if isinstance(run_a, Run) else load(run_a, quiet=True)
    run_b = run_b if isinstance(run_b, Run) else load(run_b, quiet=True)
    a, b = summarize(run_a, params), summarize(run_b, params)
    rows = []

    def row(what, va, vb, unit):
        rows.append({"metric": what, "a": va, "b": vb, "unit": unit,
                     "change": None if va is None or vb is None else round(vb - va, 4),
                     "change_percent": _pct_change(va, vb)})

    for mode in sorted(set(a["steps"]) | set(b["steps"])):
        sa, sb = a["steps"].get(mode, {}), b["steps"].get(mode, {})
        row(f"{mode} steps", sa.get("count"), sb.get("count"), "")
        row(f"{mode} step time (median)", sa.get("median_ms"), sb.get("median_ms"), "ms")
        row(f"{mode} step time (p95)", sa.get("p95_ms"), sb.get("p95_ms"), "ms")
    if a.get("interrupted") or b.get("interrupted"):  # iterations cut short, in no mode's count
        row("interrupted steps", a.get("interrupted", {}).get("count", 0), b.get("interrupted", {}).get("count", 0), "")
    if a.get("between_loops") or b.get("between_loops"):
        row("between loops (per epoch)", a.get("between_loops", {}).get("per_epoch_ms", 0.0),
            b.get("between_loops", {}).get("per_epoch_ms", 0.0), "ms")
    for phase in PHASES:
        pa, pb = a["phases"].get(phase, {}), b["phases"].get(phase, {})
        row(f"{phase} share", pa.get("share", 0.0), pb.get("share", 0.0), "ratio")
    if a.get("communication") or b.get("communication"):  # distributed jobs: the collectives' shares
        ca, cb = a.get("communication") or {}, b.get("communication") or {}
        row("communication share", ca.get("share", 0.0), cb.get("share", 0.0), "ratio")
        row("exposed communication share", ca.get("exposed_share", 0.0), cb.get("exposed_share", 0.0), "ratio")
    sa, sb = a["system"], b["system"]
    row("CPU utilization (mean)", sa.get("cpu_util_mean"), sb.get("cpu_util_mean"), "%")
    row("memory used (max)", sa.get("memory_used_max_bytes"), sb.get("memory_used_max_bytes"), "bytes")
    rules_a = {f["rule"] for f in a["findings"]}
    rules_b = {f["rule"] for f in b["findings"]}
    # what changed most: the largest relative change among the timing rows
    movers = sorted((r for r in rows if r["change_percent"] is not None and r["unit"] in ("ms", "ratio")),
                    key=lambda r: -abs(r["change_percent"]))
    # Median, not mean: one slow checkpoint step is not a slower loop.
    regressions = [{**r, "severity": "error", "max_regression_percent": limit} for r in rows
                   if r["metric"].endswith("step time (median)") and r["change_percent"] is not None
                   and r["change_percent"] > limit]
    new = rules_b - rules_a
    return {"a": a["run"], "b": b["run"], "rows": rows,
            # a run that did not close misses up to its last flush interval: its counts are not comparable
            "complete": {"a": a["complete"], "b": b["complete"]},
            "ending_warnings": {k: s["ending"]["message"] for k, s in (("a", a), ("b", b))
                                if "message" in s["ending"]},
            "findings": {"a": sorted(rules_a), "b": sorted(rules_b), "cleared": sorted(rules_a - rules_b),
                         "new": sorted(new), "cost_ms_per_step": {r: [_cost(a, r), _cost(b, r)]
                                                                  for r in sorted(rules_a | rules_b)}},
            "new_findings": [f for f in b["findings"] if f["rule"] in new],
            "regressions": regressions, "max_regression_percent": limit,
            "changed_most": [r["metric"] for r in movers[:3]],
            "step_time": step_time_change(run_a, run_b),
            "predictions": [prediction(f, run_a, run_b) for f in a["findings"]]}


#: A finding's saving is confirmed where the second run's train steps are shorter by at least
#: this share of the prediction (and the shortening is more than noise: its interval above 0).
CONFIRMED_SHARE = 0.7
#: Train steps of each process left out at the start of both runs (start-up, the first batches).
DIFF_WARMUP_STEPS = 2


def _train_durations(run, rank=None) -> tuple:
    """(each train step's duration in ms, after each process's first DIFF_WARMUP_STEPS, of
    ``rank`` where given; {(rank, loop): train steps}: the work each did)."""
    steps = run.steps
    train = steps[steps["mode"] == TRAIN]
    shape = {(None if r != r else int(r), int(lp)): int(n) for (r, lp), n in
             train.groupby([train["rank"].astype(float), train["loop"]], dropna=False).size().items()} \
        if len(train) else {}
    if rank is not None:
        train = train[train["rank"] == rank]
    ordered = train.sort_values("start_ns", kind="stable")
    kept = ordered.groupby(ordered["process"].astype(str), sort=False).cumcount() >= DIFF_WARMUP_STEPS
    return ordered.loc[kept.to_numpy(), "duration_ns"].to_numpy(dtype=float) / 1e6, shape


def step_time_change(run_a, run_b) -> dict:
    """How much shorter B's train steps are than A's on average (ms; negative: longer), with
    the interval of that difference (a bootstrap over each run's steps): ``no change`` where
    the interval holds 0, else ``faster`` or ``slower``. A run against itself: no change."""
    (da, _), (db, _) = _train_durations(run_a), _train_durations(run_b)
    d, low, high = difference_of_means(da, db)
    verdict = "no change" if low <= 0 <= high else ("faster" if low > 0 else "slower")
    return {"shorter_ms": round(d, 3), "low": round(low, 3), "high": round(high, 3), "verdict": verdict,
            "steps": [int(len(da)), int(len(db))]}


def prediction(finding: dict, run_a, run_b) -> dict:
    """Whether run B shows the saving run A's finding predicted: ``confirmed`` (B's train
    steps of the finding's rank shorter by at least CONFIRMED_SHARE of it, beyond noise),
    ``partly`` (shorter beyond noise, by less), ``not`` (not shorter beyond noise), or
    ``not comparable`` where the runs did different work (other train step counts per rank
    and loop), with why."""
    saving = finding.get("saving") or {}
    out = {"rule": finding["rule"], "rank": finding.get("rank"), "predicted": saving or None}
    rank = finding.get("rank")
    (da, shape_a), (db, shape_b) = _train_durations(run_a, rank), _train_durations(run_b, rank)
    if shape_a != shape_b:
        return {**out, "verdict": "not comparable",
                "why": (f"the runs did different work: train steps per (rank, loop) {_shape_text(shape_a)} against "
                        f"{_shape_text(shape_b)}")}
    predicted = saving.get("ms_per_step")
    if predicted is None or predicted <= 0 or not len(da) or not len(db):
        return {**out, "verdict": "not comparable", "why": "the finding predicts no saving per step"}
    d, low, high = difference_of_means(da, db)
    measured = {"ms_per_step": round(d, 3), "low": round(low, 3), "high": round(high, 3)}
    if low <= 0:
        verdict = "not"
    else:
        verdict = "confirmed" if d >= CONFIRMED_SHARE * predicted else "partly"
    return {**out, "measured": measured, "verdict": verdict,
            "measured_share_of_prediction": round(d / predicted, 3)}


def _shape_text(shape: dict) -> str:
    return ", ".join(f"{'-' if r is None else r}/{lp}: {n}" for (r, lp), n in sorted(
        shape.items(), key=lambda kv: (-1 if kv[0][0] is None else kv[0][0], kv[0][1]))) or "none"


def _cost(summary: dict, rule: str):
    """A rule's findings' summed cost per step in one run (None: no finding, or not a time)."""
    costs = [f.get("cost_ms_per_step") for f in summary["findings"] if f["rule"] == rule]
    known = [c for c in costs if c is not None]
    return round(sum(known), 3) if known else None


def gate(d: dict, level: str) -> list:
    """Why ``diff --fail-on LEVEL`` fails (empty: it passes): step-time regressions (severity
    error) and findings new in run B at or above ``level``."""
    out = []
    if SEVERITIES.index("error") >= SEVERITIES.index(level):
        out += [f"{r['metric']} {r['a']:.2f} -> {r['b']:.2f} ms ({r['change_percent']:+.1f}%, more than "
                f"{r['max_regression_percent']:g}%)" for r in d["regressions"]]
    new = at_or_above(d.get("new_findings", []), level)
    if new:
        out.append(f"new finding(s) at or above {level}: {', '.join(sorted({f['rule'] for f in new}))}")
    return out


def format_diff(d: dict) -> str:
    lines = [f"{'':32} {d['a'][:22]:>22} {d['b'][:22]:>22} {'change':>10}"]
    for side, message in d.get("ending_warnings", {}).items():
        lines.append(f"warning: run {side.upper()} ({d[side]}): {message}")
    for r in d["rows"]:
        def fmt(v):
            return "-" if v is None else (f"{100 * v:.1f}%" if r["unit"] == "ratio" else f"{v:,.2f}")
        change = "" if r["change_percent"] is None else f"{r['change_percent']:+.0f}%"
        lines.append(f"{r['metric']:32} {fmt(r['a']):>22} {fmt(r['b']):>22} {change:>10}")
    f = d["findings"]
    lines.append(f"findings: {', '.join(f['a']) or 'none'} -> {', '.join(f['b']) or 'none'}")
    for rule, (ca, cb) in f.get("cost_ms_per_step", {}).items():
        if ca is not None or cb is not None:
            lines.append(f"  {rule}: {'-' if ca is None else f'{ca:.2f}'} -> {'-' if cb is None else f'{cb:.2f}'} "
                         "ms per step")
    if f["cleared"]:
        lines.append(f"cleared: {', '.join(f['cleared'])}")
    if f["new"]:
        lines.append(f"new: {', '.join(f['new'])}")
    for r in d.get("regressions", []):
        lines.append(f"regression: {r['metric']} {r['change_percent']:+.1f}% (more than "
                     f"{r['max_regression_percent']:g}%)")
    if d["changed_most"]:
        lines.append(f"changed most: {', '.join(d['changed_most'])}")
    t = d.get("step_time")
    if t:
        lines.append(f"train steps: {t['verdict']} (B shorter by {t['shorter_ms']:.3g} ms a step on average, "
                     f"interval {t['low']:.3g} to {t['high']:.3g})")
    for p in d.get("predictions", []):
        who = f"{p['rule']}" + ("" if p.get("rank") is None else f" (rank {p['rank']})")
        saved = (p.get("predicted") or {}).get("ms_per_step")
        said = f"would save {saved:.3g} ms a step" if saved is not None else "no saving predicted"
        if "measured" in p:
            m = p["measured"]
            lines.append(f"prediction: {who} {said}: {p['verdict']} (measured {m['ms_per_step']:.3g} ms a step, "
                         f"interval {m['low']:.3g} to {m['high']:.3g})")
        else:
            lines.append(f"prediction: {who} {said}: {p['verdict']} ({p.get('why', '')})")
    return "\n".join(lines)
