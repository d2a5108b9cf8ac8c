"""Compilation as the run saw it (SPEC §6 ``compilation``; issue 59): per function
torch.compile compiled, its compiles and their time, its recompiles with dynamo's
reasons, its graph breaks by place; per tf.function, its traces and why it traced
again; and per step the time spent compiling or tracing in it.

From the framework events ``integrations/torch/_compile_events.py`` records: a span per
compile named ``torch.compile <frame>/<n> <function> (<file>:<line>)`` and an instant per
recompile carrying its reason. A graph break is the compile of a resume function,
``torch_dynamo_resume_in_<function>_at_<line>``: the break is at that line of that function;
dynamo's reason for it is an instant named by its place.

A tf.function's compile is its traces plus what its first run pays beyond a usual
run (the runtime's graph instantiation and optimization, XLA's compile): the first
run's extra time over the second, placed at the first run's start.
"""

from __future__ import annotations

import re
from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.tables import comm, compiling
from stepscope.core.vocabulary import (COMPILE_DETAIL_PREFIX, COMPILE_LIMIT_PREFIX, COMPILE_PREFIX, GRAPH_BREAK_PREFIX,
                                      JAX_COMPILE_PREFIX, RECOMPILE_PREFIX, TF_RUN_PREFIX, TRACE_PREFIX, TRAIN)

_SPAN = re.compile(r"^" + re.escape(COMPILE_PREFIX) + r" (?P<id>\S+) (?P<place>.*)$")
_RECOMPILE = re.compile(r"^" + re.escape(RECOMPILE_PREFIX) + r" (?P<id>\S+) (?P<place>.*?): (?P<reason>.*)$")
_LIMIT = re.compile(r"^" + re.escape(COMPILE_LIMIT_PREFIX) + r" (?P<id>\S+) (?P<limit>\S+) (?P<value>\S+): "
                    r"(?P<reason>.*)$")
_DETAIL = re.compile(r"^" + re.escape(COMPILE_DETAIL_PREFIX) + r" (?P<id>\S+) (?P<figures>.*)$")
_BREAK = re.compile(r"^" + re.escape(GRAPH_BREAK_PREFIX) + r" (?P<file>[^:]*):(?P<line>\d+): (?P<reason>.*)$")
_TRACE = re.compile(r"^" + re.escape(TRACE_PREFIX) + r" (?P<function>.*)#(?P<n>\d+): (?P<cause>.*)$")
_JAX = re.compile(r"^" + re.escape(JAX_COMPILE_PREFIX) + r" (?P<function>.*): (?P<stage>trace|lower|compile)$")
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<function>.+)_at_(?P<line>\d+) \((?P<file>[^:]*):")
TOP_STEPS = 5  # the steps that compiled longest, named


def _ms(ns) -> float:
    return round(float(ns) / 1e6, 3)


def _parsed(run, kind: str, pattern: re.Pattern, names: list) -> pd.DataFrame:
    """The framework events of this kind and these names, with ``pattern``'s named groups
    as columns (rows it does not match dropped)."""
    columns = ["process", "name", "start_ns"] + (["end_ns"] if kind == "span" else [])
    ev = run.select(categories=["framework"], kinds=[kind], columns=columns, names=names or [""])
    ev = ev.assign(name=ev["name"].astype(str), process=ev["process"].astype(str))
    parsed = ev["name"].str.extract(pattern)
    return pd.concat([ev, parsed], axis=1).dropna(subset=[next(iter(pattern.groupindex))])


def compile_events(run):
    """(spans, recompiles): the compile spans (process, name, start_ns, end_ns, id, place)
    and the recompile instants (process, start_ns, id, place, reason)."""
    names = run.event_names(containing=COMPILE_PREFIX)
    spans = _parsed(run, "span", _SPAN, [n for n in names if not n.startswith((RECOMPILE_PREFIX, GRAPH_BREAK_PREFIX,
                                                                               COMPILE_LIMIT_PREFIX,
                                                                               COMPILE_DETAIL_PREFIX))])
    return spans, _parsed(run, "instant", _RECOMPILE, [n for n in names if n.startswith(RECOMPILE_PREFIX)])


def compile_details(run) -> dict:
    """(process, compile id) -> what dynamo measured of it besides its length:
    {backend_ms, inductor_ms, cache_hits, cache_misses} (those this torch keeps)."""
    out = {}
    for row in _parsed(run, "instant", _DETAIL, run.event_names(containing=COMPILE_DETAIL_PREFIX)).itertuples():
        figures = {}
        for pair in str(row.figures).split():
            key, _, value = pair.partition("=")
            try:
                figures[key] = float(value) if key.endswith("_ms") else int(value)
            except ValueError:
                continue
        out[(str(row.process), str(row.id))] = figures
    return out


def limit_events(run, spans: pd.DataFrame) -> list:
    """The functions that hit dynamo's recompile limit (from then on they ran uncompiled):
    [{function, limit, value, reason, process, at_ns}], the function found by the compile
    id's frame among the compiles (``frame/n``)."""
    ev = _parsed(run, "instant", _LIMIT, run.event_names(containing=COMPILE_LIMIT_PREFIX))
    frames = {}
    for row in spans.itertuples():
        frames.setdefault((row.process, str(row.id).rsplit("/", 1)[0]), row.place)
    return [{"function": frames.get((row.process, str(row.id).rsplit("/", 1)[0]), "a compiled function"),
             "limit": str(row.limit), "value": str(row.value), "reason": str(row.reason),
             "process": str(row.process), "at_ns": int(row.start_ns)} for row in ev.itertuples()]


def trace_events(run) -> pd.DataFrame:
    """tf.function's traces: process, start_ns, end_ns, function, n (its trace number), cause."""
    traces = _parsed(run, "span", _TRACE, run.event_names(containing=TRACE_PREFIX))
    return traces.assign(n=pd.to_numeric(traces["n"]))


def first_run_extra(run) -> pd.DataFrame:
    """Per function TensorFlow built and ran twice eagerly: process, function, xla, and the
    span [start_ns, end_ns) of its first run's extra time over its second
    (``tables/compiling.py``)."""
    names = run.event_names(containing=TF_RUN_PREFIX)
    return compiling.first_runs(run.select(categories=["framework"], kinds=["span"], names=names or [""],
                                           columns=["process", "name", "start_ns", "end_ns"]))


def jax_events(run) -> pd.DataFrame:
    """JAX's compile stages: process, start_ns, end_ns, function, stage."""
    stages = _parsed(run, "span", _JAX, run.event_names(containing=JAX_COMPILE_PREFIX))
    # (a stage names jit(f), another f: one function)
    return stages.assign(function=stages["function"].str.replace(r"^jit\((.*)\)$", r"\1", regex=True))


def step_compile_ns(steps: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """Per step (row of ``steps``), the time these spans of its process ran inside it (the
    steps' ``compile_ns`` is this for every compiling span)."""
    return compiling.per_step(steps, spans)


def compilation(run) -> Optional[dict]:
    """The summary's ``compilation`` block, or None where nothing was compiled (computed
    once per loaded run: the summary and the rules ask)."""
    return run.memo("compilation", lambda: _compilation(run))


def _compilation(run) -> Optional[dict]:
    spans, recompiles = compile_events(run)
    traces = trace_events(run)
    jax = jax_events(run)
    first_runs = first_run_extra(run)
    limits = limit_events(run, spans)
    if not len(spans) and not len(traces) and not len(first_runs) and not len(jax):
        return None
    both = pd.concat([t[["process", "start_ns", "end_ns"]] for t in (spans, traces, first_runs, jax)])
    steps = run.steps
    per_step = steps["compile_ns"].to_numpy(np.int64) if len(steps) else np.zeros(0, dtype=np.int64)
    u_total = sum(int((e - s).sum()) for s, e in (comm.union(g["start_ns"].to_numpy(np.int64),
                                                             g["end_ns"].to_numpy(np.int64))
                                                  for _, g in both.groupby("process", sort=False)))
    train = (steps["mode"] == TRAIN).to_numpy() if len(steps) else np.zeros(0, dtype=bool)
    train_ns = float(steps["duration_ns"].to_numpy()[train].sum()) if len(steps) else 0.0
    details = compile_details(run)
    functions = {}
    for place, s in spans.groupby("place", sort=False):
        if _RESUME.match(place):
            continue
        r = recompiles[recompiles["place"] == place]
        functions[str(place)] = {
            "compiles": int(len(s)), "recompiles": int(len(r)),
            "compile_ms": _ms((s["end_ns"] - s["start_ns"]).sum()),
            "reasons": [str(x) for x in r["reason"].drop_duplicates().head(5)]}
        mine = [details[key] for key in zip(s["process"].astype(str), s["id"].astype(str)) if key in details]
        for key in ("backend_ms", "inductor_ms", "cache_hits", "cache_misses"):
            values = [d[key] for d in mine if key in d]
            if values:
                functions[str(place)][key] = round(sum(values), 3) if key.endswith("_ms") else int(sum(values))
    for hit in limits:  # a function that runs uncompiled from then on: from the step it was refused in
        hit.update(_step_at(steps, hit["process"], hit["at_ns"]))
        if hit["function"] in functions:
            functions[hit["function"]]["limit_hit"] = f"{hit['limit']} ({hit['value']})"
    breaks = {}
    for place, s in spans.groupby("place", sort=False):
        m = _RESUME.match(place)
        if m:
            b = breaks.setdefault((m["file"], int(m["line"])), {"function": m["function"], "file": m["file"],
                                                                "line": int(m["line"]), "compiles": 0, "reason": None})
            b["compiles"] += int(len(s))
    for name in run.event_names(containing=GRAPH_BREAK_PREFIX):  # dynamo's reasons, by place
        m = _BREAK.match(name)
        if m:
            b = breaks.setdefault((m["file"], int(m["line"])), {"function": None, "file": m["file"],
                                                                "line": int(m["line"]), "compiles": 0, "reason": None})
            b["reason"] = b["reason"] or m["reason"]
    tf_functions = {}
    for function, t in traces.groupby("function", sort=False):
        retraces = t[t["n"] > 1]
        runs = first_runs[first_runs["function"] == function]
        tf_functions[str(function)] = {
            "traces": int(t["n"].max()), "trace_ms": _ms((t["end_ns"] - t["start_ns"]).sum()),
            "first_run_extra_ms": _ms((runs["end_ns"] - runs["start_ns"]).sum()), "xla": bool(runs["xla"].any()),
            "retrace_causes": {str(k): int(v) for k, v in retraces["cause"].value_counts().items()}}
    jax_functions = {str(f): {"compiles": int((j["stage"] == "compile").sum()),
                              "compile_ms": _ms((j["end_ns"] - j["start_ns"]).sum())}
                     for f, j in jax.groupby("function", sort=False)}
    order = np.argsort(-per_step, kind="stable")[:TOP_STEPS]
    top = [{"mode": str(steps["mode"].iloc[i]), "step": int(steps["step"].iloc[i]), "rank": _rank(steps, i),
            "compile_ms": _ms(per_step[i])} for i in order if per_step[i] > 0]
    return {"compiles": int(len(spans) + len(traces) + (jax["stage"] == "compile").sum()),
            "recompiles": int(len(recompiles)), "jax_functions": jax_functions,
            "retraces": int((traces["n"] > 1).sum()), "graph_breaks": len(breaks), "tf_functions": tf_functions,
            "total_ms": _ms(u_total), "train_steps_ms": _ms(per_step[train].sum()) if len(steps) else 0.0,
            "share_of_train": round(float(per_step[train].sum()) / train_ns, 4) if train_ns else 0.0,
            "functions": functions, "breaks": list(breaks.values()), "steps": top,
            "cache_hits": int(sum(d.get("cache_hits", 0) for d in details.values())),
            "cache_misses": int(sum(d.get("cache_misses", 0) for d in details.values())),
            "limits": [{k: v for k, v in hit.items() if k != "at_ns"} for hit in limits]}


def _step_at(steps: pd.DataFrame, process: str, at_ns: int) -> dict:
    """{mode, step} of the process's step that holds ``at_ns`` (else the next one to begin),
    or {} where none does."""
    if not len(steps):
        return {}
    mine = steps[(steps["process"].astype(str) == process) & (steps["end_ns"] > at_ns)]
    if not len(mine):
        return {}
    row = mine.loc[mine["start_ns"].idxmin()]
    return {"mode": str(row["mode"]), "step": int(row["step"])}


def _rank(steps, i):
    rank = steps["rank"].iloc[i] if "rank" in steps else None
    return None if rank is None or pd.isna(rank) else int(rank)


def format_lines(c: dict) -> list:
    """The summary's lines about compilation."""
    lines = [f"  {'Compile':<10} {c['total_ms'] / 1e3:.2f} s in {c['compiles']} compile(s), {c['recompiles']} "
             f"recompile(s), {c.get('retraces', 0)} tf.function retrace(s), {c['graph_breaks']} graph break(s); "
             f"{100 * c['share_of_train']:.1f}% of train step time"]
    for place, f in list(c["functions"].items())[:5]:
        why = f": {f['reasons'][0]}" if f["reasons"] else ""
        backend = f"; backend {f['backend_ms'] / 1e3:.2f} s" if f.get("backend_ms") else ""
        lines.append(f"  {'':<10} {place}: compiled {f['compiles']}x ({f['compile_ms'] / 1e3:.2f} s{backend}), "
                     f"recompiled {f['recompiles']}x{why}")
    for name, f in list(c.get("tf_functions", {}).items())[:5]:
        causes = ", ".join(f"{k} {v}x" for k, v in f["retrace_causes"].items())
        first = f.get("first_run_extra_ms", 0.0)
        built = (f", first run +{first / 1e3:.2f} s ({'XLA compile, ' if f.get('xla') else ''}graph set-up)"
                 if first else "")
        lines.append(f"  {'':<10} tf.function {name}: traced {f['traces']}x ({f['trace_ms'] / 1e3:.2f} s){built}"
                     + (f", retraced for: {causes}" if causes else ""))
    top = sorted(c.get("jax_functions", {}).items(), key=lambda kv: -kv[1]["compile_ms"])[:5]
    for name, f in top:
        lines.append(f"  {'':<10} jax {name}: compiled {f['compiles']}x ({f['compile_ms'] / 1e3:.2f} s)")
    for hit in c.get("limits", [])[:5]:
        when = f" from {hit['mode']} step {hit['step']} on" if "step" in hit else " from then on"
        lines.append(f"  {'':<10} {hit['function']} hit torch._dynamo's {hit['limit']} ({hit['value']}): it runs "
                     f"uncompiled{when}")
    for b in c["breaks"][:5]:
        why = f": {b['reason']}" if b.get("reason") else ""
        lines.append(f"  {'':<10} graph break in {b['function'] or 'compiled code'} at {b['file']}:{b['line']}{why}")
    if c["steps"]:
        lines.append(f"  {'':<10} compiling in " + ", ".join(f"{s['mode']} step {s['step']} ({s['compile_ms']:.0f} ms)"
                                                           for s in c["steps"]))
    return lines
