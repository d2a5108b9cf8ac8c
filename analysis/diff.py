"""What changed between two runs (``stepscope diff RUN_A RUN_B``): step time, phase shares,
system use and findings side by side."""

from __future__ import annotations

from stepscope.analysis.summary import summarize
from stepscope.core.vocabulary import PHASES


def _pct_change(a, b):
    if a in (None, 0) or b is None:
        return None
    return round(100.0 * (b - a) / a, 1)


def diff(run_a, run_b, params=None) -> dict:
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
    for phase in PHASES:
        pa, pb = a["phases"].get(phase, {}), b["phases"].get(phase, {})
        row(f"{phase} share", pa.get("share", 0.0), pb.get("share", 0.0), "ratio")
    sa, sb = a["system"], b["system"]
    row("CPU utilization (mean)", sa.get("cpu_util_mean"), sb.get("cpu_util_mean"), "%")
    row("memory used (max)", sa.get("memory_used_max_bytes"), sb.get("memory_used_max_bytes"), "bytes")
    rules_a = {f["rule"] for f in a["findings"]}
    rules_b = {f["rule"] for f in b["findings"]}
    # what changed most: the largest relative change among the timing rows
    movers = sorted((r for r in rows if r["change_percent"] is not None and r["unit"] in ("ms", "ratio")),
                    key=lambda r: -abs(r["change_percent"]))
    return {"a": a["run"], "b": b["run"], "rows": rows,
            "findings": {"a": sorted(rules_a), "b": sorted(rules_b), "cleared": sorted(rules_a - rules_b),
                         "new": sorted(rules_b - rules_a)},
            "changed_most": [r["metric"] for r in movers[:3]]}


def format_diff(d: dict) -> str:
    lines = [f"{'':32} {d['a'][:22]:>22} {d['b'][:22]:>22} {'change':>10}"]
    for r in d["rows"]:
        fmt = (lambda v: "-" if v is None else (f"{100 * v:.1f}%" if r["unit"] == "ratio" else f"{v:,.2f}"))
        change = "" if r["change_percent"] is None else f"{r['change_percent']:+.0f}%"
        lines.append(f"{r['metric']:32} {fmt(r['a']):>22} {fmt(r['b']):>22} {change:>10}")
    f = d["findings"]
    lines.append(f"findings: {', '.join(f['a']) or 'none'} -> {', '.join(f['b']) or 'none'}")
    if f["cleared"]:
        lines.append(f"cleared: {', '.join(f['cleared'])}")
    if f["new"]:
        lines.append(f"new: {', '.join(f['new'])}")
    if d["changed_most"]:
        lines.append(f"changed most: {', '.join(d['changed_most'])}")
    return "\n".join(lines)
