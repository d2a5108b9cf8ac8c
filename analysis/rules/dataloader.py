"""Dataloader (SageMaker Debugger's rule): loader worker processes against the node's
cores, the GetNext distribution, and per-worker fetch times where an integration
recorded them.

Workers are the child processes the sampler saw under a training process
(``proc_*`` metrics with device ``pid<N>``: DataLoader workers, tf.data has none),
counted at the most alive at once. Cores are the node's ``cpu<N>`` series."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.quantities import ms, phase_share, steady_phase_share
from stepscope.analysis.rules.advice import advice, framework_of
from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.gpudata import memo, node_of, samples_of, train_groups
from stepscope.analysis.store.frames import as_strings
from stepscope.core.vocabulary import (GETNEXT, LOADER_FETCH, LOADER_NUM_WORKERS, LOADER_PERSISTENT, LOADER_PIN_MEMORY,
                                       TRAIN)



def worker_counts(run) -> dict:
    """process -> the most child processes (loader workers) sampled alive at once."""
    proc = samples_of(run, "proc_rss") if len(run.system) else pd.DataFrame()
    if proc.empty:
        return {}
    kids = proc[proc["device"].astype(str).str.startswith("pid")]
    return {p: int(g.groupby("timestamp_ns")["device"].nunique().max()) for p, g in kids.groupby("process")}


def core_counts(run) -> dict:
    """node -> number of CPU cores sampled."""
    cpu = samples_of(run, "cpu_util") if len(run.system) else pd.DataFrame()
    if cpu.empty:
        return {}
    cores = cpu[cpu["device"].astype(str).str.fullmatch(r"cpu\d+")]
    return {n: int(g["device"].nunique()) for n, g in cores.groupby("node")}


def _children(run, process) -> list:
    """The process folders whose parent is ``process`` (its forked DataLoader workers)."""
    procs = run.processes
    if "parent" not in procs:
        return []
    return procs.loc[procs["parent"].astype(str) == str(process), "process"].astype(str).tolist()


def worker_fetches(run, process) -> dict:
    """Per worker id, the fetch spans recorded by ``process`` or by its workers' own
    folders (``LOADER_FETCH``, integrations/torch/_workers.py: ``arg`` the worker id):
    count, median and p95 in ms. Empty when none were recorded."""
    ev = run.select(kinds=["span"], names=[LOADER_FETCH], processes=[str(process), *_children(run, process)])
    spans = ev[ev["arg"] >= 0]
    out = {}
    for worker, g in spans.groupby("arg"):
        d = (g["end_ns"] - g["start_ns"]).to_numpy(dtype=float) / 1e6
        out[str(int(worker))] = {"fetches": int(len(d)), "median_ms": round(float(np.median(d)), 3),
                                 "p95_ms": round(float(np.percentile(d, 95)), 3)}
    return out


def configured_workers(run, process) -> int:
    """The most ``num_workers`` of ``process``'s loaders (``DataLoader.num_workers``, recorded
    at each pass by the torch integration), 0 when not recorded: the sampler can miss
    short-lived workers."""
    marks = run.select(kinds=["instant"], names=[LOADER_NUM_WORKERS], processes=[str(process)])
    return int(marks["arg"].max()) if len(marks) else 0


def pin_memory(run, process):
    """Whether ``process``'s multi-process loaders pin memory (the last pass's setting,
    ``DataLoader.pin_memory``), or None when not recorded."""
    marks = run.select(kinds=["instant"], names=[LOADER_PIN_MEMORY], processes=[str(process)])
    return bool(marks["arg"].iloc[-1]) if len(marks) else None


def keeps_workers(run, process) -> bool:
    """Whether every multi-process loader pass of ``process`` kept its workers between
    epochs (``DataLoader.persistent_workers`` recorded, all 1): then its epochs' first
    steps are not told to set ``persistent_workers=True``, however long they wait."""
    marks = run.select(kinds=["instant"], names=[LOADER_PERSISTENT], processes=[str(process)])
    return bool(len(marks)) and bool((marks["arg"] > 0).all())


def per_fetch_ms(run, process, steps) -> float:
    """The mean wait of one fetch (GetNext phase) in ``process``'s train steps (``steps``:
    all of them): their GetNext time over the GetNext phases recorded in train steps (at
    least one a step that waited). Asked only where a rule is about to fire: it reads
    the phases."""
    total = float(steps[GETNEXT].sum())
    if total <= 0:
        return 0.0
    counts = memo(run, "getnext_fetches", lambda: _fetches(run))
    return total / 1e6 / max(int(counts.get(str(process), 0)), int((steps[GETNEXT] > 0).sum()), 1)


def _fetches(run) -> dict:
    phases = run.select_phases(names=[GETNEXT], modes=[TRAIN], columns=["process"])
    return pd.Series(as_strings(phases["process"])).value_counts().to_dict() if len(phases) else {}


class Dataloader(Rule):
    name = "Dataloader"
    summary = ("Data-loader worker processes against the node's CPU cores (SageMaker Debugger's Dataloader rule): "
               "too many workers for the cores, or too few while the loop waits for its data. The details give "
               "each training process's workers, the node's cores, the GetNext distribution over train steps and "
               "per-worker fetch times when an integration recorded them.")
    params = {
        "min_cores_percent": Param(70.0, "%", "fire when the workers are fewer than this share of the node's "
                                              "cores (Debugger: 70%)..."),
        "min_getnext_share": Param(0.2, "ratio", "...while GetNext takes at least this share of train step time "
                                                 "(GetNextBottleneck's threshold: too few workers only matter "
                                                 "when the loop waits for data)"),
        "min_getnext_ms": Param(0.5, "ms", "...and a fetch waits at least this long on average (GetNextBottleneck's "
                                           "floor: a smaller wait is collation in the main process, which more "
                                           "workers do not remove)"),
        "max_cores_percent": Param(200.0, "%", "fire when the workers outnumber the node's cores by more than "
                                               "this share (Debugger: 200%): they compete for the cores with "
                                               "each other and with the training process"),
        "slow_worker_ratio": Param(3.0, "ratio", "fire when one worker's median fetch takes this many times the "
                                                 "fastest worker's, while the loop waits for data (the workers' "
                                                 "fetches are recorded by the torch integration)"),
    }

    def not_applicable(self, run):
        if not (run.steps["mode"] == TRAIN).any():
            return "no train steps"
        if not core_counts(run):
            return "no per-core CPU samples"
        return None

    def _rows(self, run):
        """(process, rank, figures) per training process, computed once per run (the details
        and the findings read the same figures); each caller gets its own dicts."""
        for process, rank, row in memo(run, "dataloader_rows", lambda: list(self._figures(run))):
            yield process, rank, dict(row)

    def _figures(self, run):
        cores, workers, nodes = core_counts(run), worker_counts(run), node_of(run)
        for (process, rank), s in train_groups(run):
            node = nodes.get(process)
            if node not in cores or not len(s):
                continue
            getnext = s[GETNEXT].to_numpy(dtype=float) / 1e6
            yield process, rank, {
                "process": str(process), "node": node, "cores": cores[node],
                "workers": max(workers.get(process, 0), configured_workers(run, process)),
                "getnext_share": phase_share(s, GETNEXT),  # the summary's figure
                # (as GetNextBottleneck: without the first step and the last, start-up and shut-down)
                "getnext_share_after_warmup": steady_phase_share(s, GETNEXT, 1),
                "getnext_ms_mean": ms(s[GETNEXT].mean()),
                "getnext_ms": {"p50": round(float(np.median(getnext)), 3),
                               "p95": round(float(np.percentile(getnext, 95)), 3),
                               "max": round(float(getnext.max()), 3)},
                "worker_fetches": worker_fetches(run, process),
                "pin_memory": pin_memory(run, process),
            }

    def _per_fetch(self, run, process) -> float:
        steps = next((s for (q, _), s in train_groups(run) if q == process), None)
        return per_fetch_ms(run, process, steps) if steps is not None else 0.0

    def details(self, run, p):
        return {"processes": [row for _, _, row in self._rows(run)]}

    def evaluate(self, run, p):
        out = []
        for process, rank, row in self._rows(run):
            n, cores, share = row["workers"], row["cores"], row["getnext_share"]  # (the summary's figure, quoted)
            waits = (min(share, row["getnext_share_after_warmup"]) >= p["min_getnext_share"]  # a steady wait...
                     and self._per_fetch(run, process) >= p["min_getnext_ms"])  # ...that workers could remove
            who = rank_label(rank, process)
            if n > cores * p["max_cores_percent"] / 100:
                message = (f"{who} runs {n} data-loader workers on {cores} cores, more than "
                           f"{p['max_cores_percent']:g}% of them: they compete for the CPU")
                cost = None  # competing workers slow everything a little: no one figure per step
                fix = ("Lower num_workers to about the number of cores left after the training process's own "
                       "threads (and divide them among the ranks of a node).")
            elif n < cores * p["min_cores_percent"] / 100 and waits:
                message = (f"{who} waits for data {100 * share:.0f}% of train step time with {n} data-loader "
                           f"workers on {cores} cores (fewer than {p['min_cores_percent']:g}% of them)")
                fix = advice("feed", framework_of(run))
                cost = row["getnext_ms_mean"]  # the wait more workers would remove
            else:
                slow = _slow_worker(row["worker_fetches"], p["slow_worker_ratio"])
                if slow is None or not waits:
                    continue
                worker, slow_ms, fast_ms = slow
                message = (f"{who}: data-loader worker {worker} takes {slow_ms:.1f} ms a batch, "
                           f"{slow_ms / fast_ms:.0f}x the fastest worker ({fast_ms:.1f} ms), while the loop waits "
                           f"for data {100 * share:.0f}% of train step time")
                fix = (f"Worker {worker}'s batches cost far more than the others': look at what its samples load "
                       "(a shard on slower storage, larger or harder items, a per-worker init); spread the "
                       "expensive items over all workers (shuffle, a sampler that balances them) or add workers.")
                cost = row["getnext_ms_mean"]
                row = {**row, "slow_worker": {"worker": worker, "median_ms": slow_ms, "fastest_median_ms": fast_ms}}
            out.append(Finding(rule=self.name, rank=clean_rank(rank), severity="warning", message=message,
                               recommendation=fix, evidence=row, cost_ms_per_step=cost))
        return out


def _slow_worker(fetches: dict, ratio: float):
    """(worker id, its median ms, the fastest median ms) when one worker is ``ratio``
    times slower than the fastest, else None."""
    medians = {w: f["median_ms"] for w, f in fetches.items() if f["fetches"] >= 2}
    if len(medians) < 2:
        return None
    worker = max(medians, key=medians.get)
    fastest = min(medians.values())
    if fastest > 0 and medians[worker] >= ratio * fastest:
        return worker, medians[worker], fastest
    return None
