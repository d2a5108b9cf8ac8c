"""MaxInitializationTime: time from process start to the first step.

A session started from code in a process that was already running (a notebook,
a test runner, a service) counts from its own start: what the process did
before profiling began is not this job's initialization."""

from __future__ import annotations

from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.store.frames import groups


class MaxInitializationTime(Rule):
    name = "MaxInitializationTime"
    summary = "Time from a process's start to its first step."
    params = {"threshold_s": Param(120.0, "s", "fire when the first step starts later than this")}

    def not_applicable(self, run):
        if not len(run.steps):
            return "no steps"
        if run.processes["start_time"].isna().all():
            return "process start times unknown"
        return None

    def evaluate(self, run, p):
        out = []
        procs = run.processes
        session = procs["session_start"] if "session_start" in procs else procs["start_time"]
        starts = {name: _latest(a, b) for name, a, b in zip(procs["process"], procs["start_time"], session)}
        for (process, rank), s in groups(run.steps, ["process", "rank"], ["start_ns"]):
            began = starts.get(process)
            if began is None or began != began:
                continue
            init_s = s["start_ns"].min() / 1e9 - float(began)
            if init_s <= p["threshold_s"]:
                continue
            out.append(Finding(
                rule=self.name, rank=clean_rank(rank), severity="warning",
                message=(f"{rank_label(rank, process)} spent {init_s:.1f} s between process start and its "
                         f"first step (threshold {p['threshold_s']:g} s)"),
                recommendation=("Find what runs before the loop in the timeline: downloading or unpacking "
                                "data (stage it on local disk beforehand), building indexes, compiling "
                                "(cache compiled artefacts), loading a checkpoint, or waiting for other "
                                "ranks at the first collective."),
                evidence={"process": str(process), "initialization_s": round(init_s, 3),
                          "threshold_s": p["threshold_s"]}))
        return out


def _latest(*times):
    known = [float(t) for t in times if t is not None and t == t]
    return max(known) if known else None
