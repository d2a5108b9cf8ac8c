"""``stepscope report``: one self-contained HTML file (opens offline, a few MB at most).



Sections: verdict (findings with recommendations), rules (every rule, its
parameters as used, triggered or passed), job summary, step time, data loading,
system (with per-node statistics), GPU (only with GPU activity), GPU
utilization and memory (box plots per GPU, only with NVML samples), timeline (a canvas viewer:
timeline.py builds its data, timeline.js draws it), run metadata. The size is
bounded whatever the run's length: plots have a ceiling of points and inline
only the part of plotly.js they use (plots.py); the timeline has every span of
a few chosen steps and step-level coverage for the rest (timeline_detail.py),
and names the Perfetto export for every event. Every user-supplied string
(names, command line, messages) is escaped; plots are drawn when scrolled near,
so a large report opens at once.
"""

from __future__ import annotations

import html
import json
import os
import time
from typing import Optional

from stepscope.analysis.loops import format_lines
from stepscope.analysis.report import plots
from stepscope.analysis.report import sections as sections_
from stepscope.analysis.report.compile_section import compilation_section
from stepscope.analysis.report.flame import flame_section
from stepscope.analysis.report.summary import dropped_where, saving_text, summarize
from stepscope.analysis.report.timeline import script_json, timeline_data
from stepscope.analysis.run import Run
from stepscope.core import files
from stepscope.core.vocabulary import REPORT_FILE


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _loop_notes(summary: dict) -> str:
    """What the summary says about a loop stepscope did not understand (analysis/loop.py)."""
    out = []
    for n in summary.get("loop_notes", []):
        evidence = json.dumps(n["evidence"], indent=1, default=str)
        out.append(f'<div class="finding loop-note" id="note-{_esc(n["key"])}"><h3>{_esc(n["title"])}</h3>'
                   f'<p>{_esc(n["message"])}</p><p class="rec">{_esc(n["recommendation"])}</p>'
                   f'<details><summary>evidence</summary><pre>{_esc(evidence)}</pre></details></div>')
    return "\n".join(out)


ENDING_TITLES = {"running": "The run is still running", "not_closed": "The run ended without closing",
                 "unknown": "The run did not close"}


def _ending(summary: dict) -> str:
    """A run that did not close misses up to its last flush interval (analysis/ending.py)."""
    e = summary.get("ending") or {}
    if "message" not in e:
        return ""
    title = ENDING_TITLES.get(e.get("state"), ENDING_TITLES["unknown"])
    return (f'<div class="finding warning run-ending" id="run-ending"><h3>{_esc(title)}</h3>'
            f'<p>{_esc(e["message"][:1].upper() + e["message"][1:])}.</p></div>')


def _saving_ms(finding: dict) -> float:
    """A finding's saving per step (its cost where it has none; -1 where neither: memory)."""
    ms = (finding.get("saving") or {}).get("ms_per_step", finding.get("cost_ms_per_step"))
    return -1.0 if ms is None else float(ms)


def _verdict(summary: dict) -> str:
    return _ending(summary) + _verdict_body(summary)


def _verdict_body(summary: dict) -> str:
    findings = summary["findings"]
    notes = _loop_notes(summary)
    if not findings and notes:
        body = notes
    elif not findings:
        body = '<p class="ok">No problems found.</p>'
    else:
        items = []
        for f in sorted(findings, key=_saving_ms, reverse=True):  # the largest saving first
            evidence = json.dumps(f["evidence"], indent=1, default=str)
            cost = f.get("cost_ms_per_step")
            what_if = (f.get("saving") or {}).get("basis") == "what-if"
            saving = f"; {saving_text(f).strip(' ()')}" if what_if else ""
            cost_html = f' <span class="muted">costs {cost:.3g} ms a step{_esc(saving)}</span>' if cost else ""
            # findings this one explains (analysis/rules/relate.py): one problem, shown once
            explains = "".join(f'<li>{_esc(e.get("rule", ""))}: {_esc(e.get("why", ""))}</li>'
                               for e in f.get("explains") or [])
            explains_html = f'<p class="muted">Also seen, because of this:</p><ul>{explains}</ul>' if explains else ""
            items.append(f'<div class="finding {_esc(f["severity"])}"><h3>{_esc(f["rule"])}{cost_html}</h3>'
                         f'<p>{_esc(f["message"])}</p><p class="rec">{_esc(f["recommendation"])}</p>{explains_html}'
                         f'<details><summary>evidence</summary><pre>{_esc(evidence)}</pre></details></div>')
        body = "\n".join(([notes] if notes else []) + items)
    skipped = summary.get("rules_not_applicable", {})
    if skipped:
        body += "<p class='muted'>Not applicable to this run: " + "; ".join(
            f"{_esc(k)} ({_esc(v)})" for k, v in skipped.items()) + "</p>"
    return body


def _job_summary(run: Run, summary: dict) -> str:
    steps = run.steps
    procs = run.processes
    ext = run.extents()
    rows = []
    start = run.info.get("start_time")
    if start:
        rows.append(("start", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(start)))))
    rows.append(("duration", f"{summary['duration_s']:.2f} s"))
    if len(steps) and len(ext):
        t0, t1 = int(ext["start_ns"].min()), int(ext["end_ns"].max())
        s0, s1 = int(steps["start_ns"].min()), int(steps["end_ns"].max())
        total = max(t1 - t0, 1)
        for label, a, b in (("initialization", t0, s0), ("training loop", s0, s1), ("finalization", s1, t1)):
            rows.append((label, f"{(b - a) / 1e9:.2f} s ({100 * (b - a) / total:.0f}%)"))
    for mode, st in summary["steps"].items():
        rows.append((f"{mode} steps", f"{st['count']} (median {st['median_ms']:.2f} ms, p95 {st['p95_ms']:.2f} ms)"))
    if summary.get("interrupted"):
        i = summary["interrupted"]
        rows.append(("interrupted steps", f"{i['count']} ({i['total_ms']:.1f} ms): ended without their optimizer "
                                          "step, in no statistics"))
    if summary.get("between_loops"):
        b = summary["between_loops"]
        rows.append(("between loops", f"{b['per_epoch_ms']:.1f} ms per epoch, in no step: "
                     + ", ".join(f"{k} {v:.1f} ms" for k, v in b["parts"].items())))
    for line in format_lines(summary.get("loops", [])):  # several loops one after another: each one's figures
        label, _, figures = line.strip().partition(": ")
        rows.append((label, figures))
    rows.append(("ranks", str(summary["ranks"])))
    rows.append(("hosts", ", ".join(sorted({str(h) for h in procs["host"].dropna()}))))
    rows.append(("processes", str(len(procs))))
    return "<table>" + "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _figure_html(fig, key: str) -> str:
    height = fig.layout.height or 450
    return (f'<div class="plot" id="{key}" style="min-height:{int(height)}px"></div>'
            f'<script type="application/json" id="{key}-data">{script_json(plots.figure_payload(fig))}</script>')


def _step_list(chosen: list) -> str:
    buttons = "".join(f'<button class="tl-jump" data-mode="{_esc(c["mode"])}" data-step="{int(c["step"])}" '
                      f'title="{_esc(c["why"])}">{_esc(c["mode"])} {int(c["step"])}</button>' for c in chosen)
    return f"<p class='tl-steps'>Steps in full detail: {buttons}</p>" if chosen else ""


def _timeline_note(run: Run, meta: dict) -> str:
    export = f"<code>stepscope export {_esc(run.name)} --format perfetto</code>"
    large = meta.get("phases_only_outside_detail")  # a large run: its events table is never built
    merged = meta["detail_quantum_ns"] or meta["overview_steps_per_bar"] or meta["overview_quantum_ns"]
    if not (merged or large):
        return f"<p class='muted'>Every event is here. For Perfetto: {export}.</p>"
    why = {}
    for c in meta["detail_steps"]:
        for w in c["why"].split(", "):
            why.setdefault(w, []).append(f"{c['mode']} {c['step']}")
    chosen = "; ".join(f"{w}: {', '.join(s)}" for w, s in why.items())
    rest = (f"one coverage bar per track and per {meta['overview_steps_per_bar']} step(s)"
            if meta["overview_steps_per_bar"] else
            f"coverage bars of {meta['overview_quantum_ns'] / 1e6:g} ms" if meta["overview_quantum_ns"] else
            "every span") + (" (how many spans, how busy)" if merged else "")
    if large:
        every = meta.get("overview_phase_steps_every", 1)
        rest = ("its phases only (no GPU operations" + (f"; those of every {every}th step" if every > 1 else "")
                + f"): {rest}")
    detail = (f"; within them, spans shorter than {meta['detail_quantum_ns'] / 1e3:g} µs are merged too"
              if meta["detail_quantum_ns"] else "")
    size = "This run is large" if large else f"This run has {meta['spans']:,} spans"
    return (f"<p class='muted' id='tl-capped'>{size}; to keep this page small it "
            f"holds {meta['items']:,} items: every span of the steps chosen for meaning ({_esc(chosen)}){detail}, "
            f"and for the rest of the run {rest}. Every event: {export}"
            + (" (add <code>--steps A-B</code> for a window of this large run)" if large else "")
            + ", then open the file in ui.perfetto.dev "
            f"(or <code>--format chrome</code> for chrome://tracing); <code>stepscope report {_esc(run.name)} "
            "--steps A-B</code> keeps steps A to B in full detail.</p>")


def _timeline(run: Run, summary: dict, steps_asked=None) -> str:
    """The canvas viewer (timeline.js, inlined) and its data (timeline.py)."""
    data = timeline_data(run, summary["findings"], steps_asked)
    if data is None:
        return "<p class='muted'>No events.</p>"
    meta = data["meta"]
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "timeline.js"), encoding="utf-8") as f:
        js = f.read()
    return (f"{_timeline_note(run, meta)}{_step_list(meta['detail_steps'])}<div id='tl'></div>"
            f"<script type='application/json' id='tl-data'>{script_json(data)}</script><script>{js}</script>")


def _metadata(run: Run, summary: dict) -> str:
    info = dict(run.info)
    rows = [("run", run.name), ("path", run.path), ("command", " ".join(map(str, info.get("command", [])))),
            ("versions", json.dumps(info.get("versions", {}))), ("config", json.dumps(info.get("config", {}))),
            ("dropped events", f"{summary['dropped_events']:,}"
             + (f" ({dropped_where(summary)})" if dropped_where(summary) else ""))]
    for note in run.notes:
        rows.append(("not measured", note))
    for w in run.warnings:
        rows.append(("read warning", w))
    return "<table>" + "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows) + "</table>"


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222}
h1{margin-bottom:0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse}th{text-align:left;padding:.2em 1em .2em 0;color:#555;vertical-align:top}
td{padding:.2em 0}table.grid td,table.grid th{padding:.15em .8em .15em 0;border-bottom:1px solid #eee}
table.grid td{text-align:right}
table.grid td:first-child,table.rules td,table.sysstats td:nth-child(-n+3){text-align:left}
tr.rule.triggered td:nth-child(2){color:#c0392b;font-weight:bold}tr.rule.passed td:nth-child(2){color:#2a7a2a}
.params{font-family:monospace;font-size:.85em}
.finding{border-left:4px solid #e45756;padding:.2em 1em;margin:1em 0;background:#fdf3f3}
.finding.info{border-color:#4c78a8;background:#f3f6fb}
.finding.loop-note{border-color:#f58518;background:#fff7ec}.finding h3{margin:.3em 0}.rec{color:#333;font-style:italic}
.ok{color:#2a7a2a;font-weight:bold}.muted{color:#777;font-size:.9em}pre{white-space:pre-wrap;font-size:.85em}
nav a{margin-right:1em}
#tl{margin-top:.5em}.tl-bar{margin:.3em 0}.tl-bar button,.tl-bar input{margin-right:.4em}
.tl-scroll{max-height:640px;overflow-y:auto;border:1px solid #ddd}#tl-canvas{display:block;outline:none}
.tl-details{min-height:3em;margin-top:.4em;font-size:.9em}
.tl-jump{margin:0 .3em .3em 0;font-size:.85em}
"""


def render(run: Run, params: Optional[dict] = None, steps: Optional[list] = None) -> str:
    """steps: [(first, last)] train steps to keep in full detail in the timeline (a larger page)."""
    summary = summarize(run, params)
    sections = [("verdict", "Verdict", _verdict(summary)), ("rules", "Rules", sections_.rules_html(summary, _esc)),
                ("summary", "Job summary", _job_summary(run, summary))]
    figure_sections = [("steps", "Step time", "", plots.step_figures(run))]
    communication = plots.communication_section(run, _esc, summary)
    if communication is not None:  # only where collectives were recorded
        figure_sections.append(("communication", "Communication", *communication))
    compiled = compilation_section(run, _esc, summary)
    if compiled is not None:  # only where torch.compile compiled something
        figure_sections.append(("compilation", "Compilation", *compiled))
    loading = sections_.dataloading(run, _esc)
    if loading is not None:
        figure_sections.append(("dataloading", "Data loading", *loading))
    figure_sections.append(("system", "System", sections_.system_stats_html(run.system, _esc),
                            plots.system_figures(run, _esc)))
    gpu = plots.gpu_section(run, _esc)
    if gpu is not None:  # only where the run has GPU activity
        figure_sections.append(("gpu", "GPU", *gpu))
    boxes = sections_.gpu_boxes(run)
    if boxes:  # only with NVML samples
        figure_sections.append(("gpu-usage", "GPU utilization and memory", "", boxes))
    flames = flame_section(run, _esc)
    if flames is not None:  # only where Python stacks were sampled in steps
        figure_sections.append(("flame", "Python flame graphs", *flames))
    for key, title, head, figs in figure_sections:
        parts = [head] + [_figure_html(fig, f"{key}-plot{i}") for i, fig in enumerate(figs)]
        sections.append((key, title, "\n".join(p for p in parts if p) or "<p class='muted'>No data.</p>"))
    operators = sections_.operators_html(run, _esc, windows=summary.get("profiler_windows"))
    if operators:  # only where operator windows ran
        sections.append(("operators", "Operators", operators))
    sections.append(("timeline", "Timeline", _timeline(run, summary, steps)))
    sections.append(("metadata", "Run metadata", _metadata(run, summary)))
    nav = " ".join(f'<a href="#{k}">{_esc(t)}</a>' for k, t, _ in sections)
    body = "\n".join(f'<section id="{k}"><h2>{_esc(t)}</h2>{content}</section>' for k, t, content in sections)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>stepscope: {_esc(run.name)}</title>"
            f"<style>{STYLE}</style></head><body><h1>stepscope report: {_esc(run.name)}</h1>"
            f"<nav>{nav}</nav>{body}"
            f"<script type='application/json' id='plot-template'>{script_json(plots.template_json())}</script>"
            f"<script type='text/plain' id='plotly-gz'>{plots.plotly_bundle_gz_b64()}</script>"
            f"<script>{plots.PLOT_LOADER}</script></body></html>")


def write_report(run: Run, out: Optional[str] = None, params: Optional[dict] = None,
                 steps: Optional[list] = None) -> str:
    out = out or os.path.join(run.path, REPORT_FILE)
    text = render(run, params, steps)
    tmp = f"{out}.tmp{os.getpid()}"
    with files.open_new(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out)
    return out
