"""The run's numbers and the rules' findings (SPEC §6): what ``stepscope summary`` prints.

Every figure comes from ``analysis/quantities.py``, which the rules use too.
"""

from __future__ import annotations


# stepscope's operator windows cost a short run this share of its step time, or more:
# the summary's notes say so (their time is in Other, not in the phase they interrupted)

from stepscope.analysis.communication import communication, format_lines as communication_lines
from stepscope.analysis.compilation import compilation, format_lines as compilation_lines
from stepscope.analysis.ending import run_ending
from stepscope.analysis.epochs import between_epochs, format_line as between_epochs_line
from stepscope.analysis.loop import run_loop_notes
from stepscope.analysis.loop_edges import between_loops, format_line as between_loops_line
from stepscope.analysis.loops import format_lines, loops_block
from stepscope.analysis.quantities import (other_share, percent, phase_shares, profiler_windows, step_stats,
                                           summary_steps)
from stepscope.analysis.rules import evaluate
from stepscope.analysis.run import Run, load
from stepscope.analysis.tables.system import summarize_system
from stepscope.analysis.store.frames import split
from stepscope.core.vocabulary import INTERRUPTED


PROFILER_NOTE_SHARE = 0.02
PROFILER_NOTE = ("stepscope's PyTorch operator windows took {total_ms:.1f} ms ({percent} of the time of all steps, "
                 "{windows} window(s)): opening one starts torch's profiler, closing one reads and writes every "
                 "operator of its sampled steps. "
                 "That time is counted in Other, not in the phase it interrupted; a longer run spreads it "
                 "(after the first window, train steps 5-7, windows stay within 1% of the run), "
                 "STEPSCOPE_OPS=0 turns them off")


def summarize(run, params=None) -> dict:
    """SPEC §6; params: {rule: {param: value}} overrides for the rules."""
    r = run if isinstance(run, Run) else load(run, quiet=True)
    steps, extents = r.steps, r.extents()
    if len(extents):
        duration_s = (int(extents["end_ns"].max()) - int(extents["start_ns"].min())) / 1e9
    else:
        duration_s = float(r.info.get("duration_s") or 0.0)
    ending = run_ending(r)
    out = {
        "run": r.name,
        "ranks": r.ranks_with_events(),
        "duration_s": round(duration_s, 3),
        "steps": {},
        "phases": {},
        "system": summarize_system(r.system),
        "findings": [],
        "dropped_events": int(r.dropped_events),
        "dropped_by_rank": dict(getattr(r, "dropped_by_rank", {})),  # {rank (or process folder): events}
        "names_folded": int(getattr(r, "names_folded", 0)),
        # a run that did not close is missing up to its last flush interval (analysis/ending.py)
        "complete": ending["complete"],
        "ending": ending,
        "warnings": ([ending["message"]] if "message" in ending else []) + list(r.warnings),
        "dropped_samples": int(getattr(r, "dropped_samples", 0)),  # Python stack samples lost to damage
        "notes": r.notes,
    }
    for mode, s in split(steps, "mode", ["duration_ns"]):  # (step_stats' column)
        if mode != INTERRUPTED:
            out["steps"][mode] = step_stats(s)
    interrupted = steps[steps["mode"] == INTERRUPTED] if len(steps) else steps
    if len(interrupted):
        # iterations that ended without their optimizer step: on the timeline, in no step count
        out["interrupted"] = {"count": int(len(interrupted)),
                              "total_ms": round(float(interrupted["duration_ns"].sum()) / 1e6, 3)}
    out["phases"] = phase_shares(summary_steps(steps))
    other = other_share(summary_steps(steps))
    if other is not None:
        out["other"] = other  # the steps' time in no phase, over the same steps as the phases
    comm = communication(r)
    if comm is not None:
        out["communication"] = comm  # collectives: in flight, exposed, overlapped; who waited for whom
    compiled = compilation(r)
    if compiled is not None:
        out["compilation"] = compiled  # torch.compile: compiles, recompiles and why, graph breaks, per step
    windows = profiler_windows(r, steps)
    if windows is not None:
        out["profiler_windows"] = windows
        if windows["share"] >= PROFILER_NOTE_SHARE:
            out["notes"] = list(out["notes"]) + [PROFILER_NOTE.format(**windows, percent=percent(windows["share"]))]
    epochs = between_epochs(r)
    if epochs is not None:
        out["between_epochs"] = epochs  # a Keras fit's time outside its steps, named
    else:
        edges = between_loops(r)  # any other loop's: the gaps between a thread's loops
        if edges is not None:
            out["between_loops"] = edges  # the loops' time outside every step, named (SPEC §3)
    loops = loops_block(r)
    if loops:
        out["loops"] = loops  # a process ran several loops one after another: each one's figures (SPEC §3)
    out["loop_notes"] = run_loop_notes(r, ending)
    rules = evaluate(r, params)
    out["findings"] = rules["findings"]
    out["related_findings"] = rules.get("related_findings", [])  # explained by a finding above
    out["rules_not_applicable"] = rules["not_applicable"]
    out["rules_params"] = rules.get("params", {})  # each rule's parameters as used
    out["rule_details"] = rules.get("details", {})
    out["below_cost_floor"] = rules.get("below_cost_floor", [])  # negligible: not findings (SPEC §7)
    out["param_translations"] = rules.get("translations", [])
    out["warnings"] = list(out["warnings"]) + rules.get("warnings", [])
    return out


def format_text(s: dict) -> str:
    state = {"running": " (still running)", "not_closed": " (ended without closing)",
             "unknown": " (did not close)"}.get(s.get("ending", {}).get("state"), "")
    lines = [f"run {s['run']}: {s['duration_s']:.2f} s, {s['ranks']} rank(s){state}"]
    for mode, st in s["steps"].items():
        lines.append(f"  {mode:<8} {st['count']:>6} steps  mean {st['mean_ms']:.2f} ms  "
                     f"median {st['median_ms']:.2f} ms  p95 {st['p95_ms']:.2f} ms  max {st['max_ms']:.2f} ms")
    if s.get("loops"):
        lines.append(f"  {len(s['loops'])} loops, one after another (each judged on its own):")
        lines.extend(format_lines(s["loops"]))
    if s.get("interrupted"):
        i = s["interrupted"]
        lines.append(f"  {'':<8} {i['count']:>6} interrupted step(s), {i['total_ms']:.1f} ms: iterations that ended "
                     "without their optimizer step (an exception, Ctrl-C), counted in no statistics")
    for phase, p in s["phases"].items():
        where = f"of the {p['sampled_steps']} sampled steps' time" if "sampled_steps" in p else "of train step time"
        lines.append(f"  {phase:<10} {percent(p['share']):>6} {where} ({p['total_ms']:.1f} ms)")
    if s.get("other") and s["phases"]:
        o = s["other"]
        where = f"of the {o['sampled_steps']} sampled steps' time" if "sampled_steps" in o else "of train step time"
        lines.append(f"  {'Other':<10} {percent(o['share']):>6} {where}, in no phase ({o['total_ms']:.1f} ms)")
    if s.get("communication"):
        lines.extend(communication_lines(s["communication"], s["phases"]))
    if s.get("compilation"):
        lines.extend(compilation_lines(s["compilation"]))
    if s.get("profiler_windows", {}).get("share", 0) >= PROFILER_NOTE_SHARE:
        w = s["profiler_windows"]
        lines.append(f"  (stepscope {percent(w['share']):>6} of step time in {w['windows']} operator "
                     f"window(s), counted in Other: STEPSCOPE_OPS=0 turns them off)")
    if s.get("between_epochs"):
        lines.append(between_epochs_line(s["between_epochs"]))
    if s.get("between_loops"):
        lines.append(between_loops_line(s["between_loops"]))
    sysb = s["system"]
    if sysb.get("cpu_util"):
        c = sysb["cpu_util"]
        lines.append(f"  CPU        mean {c['mean']:.0f}%  p95 {c['p95']:.0f}%  max {c['max']:.0f}% (all cores)")
    if sysb.get("memory_used_max_bytes"):
        lines.append(f"  memory     max {sysb['memory_used_max_bytes'] / 2**30:.2f} GiB used")
    if s["dropped_events"]:
        where = dropped_where(s)
        lines.append(f"  {s['dropped_events']:,} events dropped (the writer could not keep up)"
                     + (f": {where}" if where else ""))
    if s.get("dropped_samples"):
        lines.append(f"  {s['dropped_samples']} Python stack samples dropped (their stacks were lost to damage)")
    for w in s.get("warnings", []):
        lines.append(f"  warning: {w}")
    for n in s.get("notes", []):  # what could not be measured (a custom loop's steps of an undetermined mode...)
        lines.append(f"  note: {n}")
    for t in s.get("param_translations", []):
        lines.append(f"  param: {t}")
    for note in s.get("loop_notes", []):
        lines.append(f"note [{note['key']}]: {note['message']}")
        lines.append(f"      -> {note['recommendation']}")
    if s.get("findings"):
        lines.append("findings:")
        for f in s["findings"]:
            level = "" if f.get("severity", "warning") == "warning" else f" ({f['severity']})"
            lines.append(f"  [{f['rule']}]{level} {f['message']}{saving_text(f)}")
            lines.append(f"      -> {f['recommendation']}")
            for e in f.get("explains", []):
                lines.append(f"      (also {e['rule']}, because of this: {e['why']})")
    else:
        lines.append("findings: no problems found")
    return "\n".join(lines)


def saving_text(finding: dict) -> str:
    """" (would save about 12.3 ms a step, 25% of the loop; interval 11.8-12.9)": the
    finding's ``saving`` as the text summary and the report say it; its cost where it has
    none."""
    saving = finding.get("saving") or {}
    ms = saving.get("ms_per_step")
    if ms is None:
        cost = finding.get("cost_ms_per_step")
        return f" (about {cost:.2f} ms per step)" if cost else ""
    share = f", {100 * saving['share']:.0f}% of the loop" if saving.get("share") is not None else ""
    spread = (f"; interval {saving['low']:.3g}-{saving['high']:.3g}"
              if saving.get("low") is not None and saving.get("high") is not None else "")
    return f" (would save about {ms:.3g} ms a step{share}{spread})"


def dropped_where(s: dict) -> str:
    """Which ranks the dropped events were lost on ("rank 1 1,234, rank 3 56"; a process
    without a rank by its folder), where the run has more than one process or the dropping
    process has a rank (a distributed job: its other ranks may have recorded nothing); else ""."""
    by = s.get("dropped_by_rank") or {}
    if not (len(by) > 1 or s.get("ranks", 1) > 1 or any(k.isdigit() for k in by)):
        return ""
    return ", ".join(f"{'rank ' + k if k.isdigit() else k} {v:,}" for k, v in by.items())
