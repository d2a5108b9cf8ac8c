"""One problem, one finding: after every rule has run, a finding whose cause another finding
explains is folded under it (docs/rules.md, "Related findings").

A launch-bound loop keeps the host thread that launches kernels busy (CPUBottleneck), a
starving loader leaves the GPU idle while the CPU makes batches (CPUBottleneck,
LowGPUUtilization, BatchSize, IOBottleneck, Dataloader), and a cheap per-step sync rides
along with whatever the job's real problem is (HostSyncStall). Each relation is judged on
the run's figures, never on the rule names alone: a job with two independent problems keeps
both findings as primaries."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from stepscope.analysis.rules.base import MIN_COST_MS, MIN_COST_SHARE, MIN_TOTAL_S, Finding
from stepscope.analysis.rules.gpudata import node_of
from stepscope.analysis.store.frames import as_strings
from stepscope.core.vocabulary import GETNEXT, TRAIN

#: A primary explains a secondary's low-GPU time when its own cost covers at least this share of
#: the GPU's idle time over the same steps (the rest may have another cause, but not most of it).
EXPLAINED = 0.5
LOW_GPU = ("CPUBottleneck", "IOBottleneck", "LowGPUUtilization", "BatchSize")


def _scope(f: Finding, nodes: dict) -> dict:
    """Where a finding is: node, GPU, process and rank, as far as its evidence says."""
    ev = f.evidence or {}
    process = ev.get("process")
    gpu = ev.get("gpu") or (f"gpu{ev['device']}" if isinstance(ev.get("device"), int) else None)
    return {"node": ev.get("node") or nodes.get(process), "gpu": gpu, "process": process, "rank": f.rank}


def _same_place(a: dict, b: dict) -> bool:
    """Same node or process, and no key both know disagrees."""
    if not any(a[k] is not None and a[k] == b[k] for k in ("node", "process")):
        return False
    return all(a[k] is None or b[k] is None or a[k] == b[k] for k in a)


def _window_steps(run, f: Finding, process) -> Tuple[float, "object"]:
    """The secondary's low windows (as its evidence lists them): the GPU's idle ms in them, and
    the primary process's train steps that ran in them."""
    windows = (f.evidence or {}).get("low_windows") or []
    idle = sum((w["end_s"] - w["start_s"]) * (1 - w.get("gpu_util", 100.0) / 100) * 1e3 for w in windows)
    steps = run.steps[(run.steps["mode"] == TRAIN) & (as_strings(run.steps["process"]) == str(process))]
    inside = np.zeros(len(steps), dtype=bool)
    for w in windows:
        if len(w.get("steps") or []) == 2:
            inside |= steps["step"].between(*w["steps"]).to_numpy()
    return idle, steps[inside]


def _loader(run, primary: Finding, secondary: Finding, params) -> Optional[str]:
    """GetNextBottleneck -> a low-GPU finding: the loop waits for data through most of the GPU's
    idle time in the secondary's windows."""
    idle, steps = _window_steps(run, secondary, primary.evidence.get("process"))
    if idle <= 0 or steps.empty:
        return None
    waiting = float(steps[GETNEXT].sum()) / 1e6
    if waiting < EXPLAINED * idle:
        return None
    busy = (" the busy CPU makes the batches the loop waits for:" if secondary.rule == "CPUBottleneck" else
            " the loader waits for storage:" if secondary.rule == "IOBottleneck" else "")
    return (f"the GPU idles while the loop waits for its data:{busy} GetNext takes {waiting:.0f} ms of the "
            f"{idle:.0f} ms the GPU idles in these windows")


def _launch(run, primary: Finding, secondary: Finding, params) -> Optional[str]:
    """KernelLaunchBound -> a low-GPU finding: launch gaps are most of the GPU's idle time per
    step; for CPUBottleneck only the training process's own thread may be the busy CPU (launching
    keeps one core busy, not all of them)."""
    if secondary.rule == "CPUBottleneck":
        cpu_all = secondary.evidence.get("means", {}).get("cpu_util")
        if cpu_all is None or cpu_all >= params["CPUBottleneck"]["cpu_threshold"]:
            return None
    idle, steps = _window_steps(run, secondary, primary.evidence.get("process"))
    if idle <= 0 or steps.empty or primary.cost_ms_per_step is None:
        return None
    idle_per_step = idle / len(steps)
    if primary.cost_ms_per_step < EXPLAINED * idle_per_step:
        return None
    what = "the host thread that launches the kernels is the busy CPU; " if secondary.rule == "CPUBottleneck" else ""
    return (f"{what}waiting for kernel launches is {primary.cost_ms_per_step:.2f} ms of the "
            f"{idle_per_step:.2f} ms per step the GPU idles in these windows")


def _workers(run, primary: Finding, secondary: Finding, params) -> Optional[str]:
    """GetNextBottleneck -> Dataloader's too-few-workers or slow-worker finding on the same
    process: the same wait, with its cause named (too many workers is a problem of its own)."""
    ev = secondary.evidence
    if secondary.cost_ms_per_step is None or str(ev.get("process")) != str(primary.evidence.get("process")):
        return None
    slow = ev.get("slow_worker")
    if slow:
        return (f"the cause of this wait: data-loader worker {slow['worker']} takes {slow['median_ms']:.1f} ms a "
                f"batch, the fastest {slow['fastest_median_ms']:.1f} ms")
    return (f"the cause of this wait: {ev.get('workers')} data-loader workers on {ev.get('cores')} cores")


def _epoch_starts(run, primary: Finding, secondary: Finding, params) -> Optional[str]:
    """GetNextBottleneck -> StepOutlier on the same process, where both found the epochs' first
    steps waiting for restarted DataLoader workers: the outliers are that wait, and the
    primary's persistent_workers figure covers them."""
    epoch = primary.evidence.get("epoch_start")
    if not epoch or not secondary.evidence.get("epoch_start") or \
            str(secondary.evidence.get("process")) != str(primary.evidence.get("process")):
        return None
    return ("the outliers are the first (and last) steps of epochs, where the DataLoader starts (and stops) "
            f"its workers ({epoch['first_step_getnext_ms']:.0f} ms for the first batch against "
            f"{epoch['other_getnext_ms']:.1f} ms): persistent_workers=True removes them")


# (primary rule, secondary rule, test -> why, or None when the primary does not explain it)
RELATIONS: List[Tuple[str, str, Callable]] = (
    [("KernelLaunchBound", r, _launch) for r in ("CPUBottleneck", "LowGPUUtilization", "BatchSize")]
    + [("GetNextBottleneck", r, _loader) for r in LOW_GPU]
    + [("GetNextBottleneck", "Dataloader", _workers), ("GetNextBottleneck", "StepOutlier", _epoch_starts)])


def _minor_sync(f: Finding, params) -> Optional[str]:
    """HostSyncStall costing under related_below of the step: the host waits, the GPU does not."""
    if f.rule != "HostSyncStall" or f.cost_ms_per_step is None:
        return None
    step = f.evidence.get("step_ms_mean") or 0.0
    if not step or f.cost_ms_per_step >= params["HostSyncStall"]["related_below"] * step:
        return None
    return (f"a per-step synchronization that costs {f.cost_ms_per_step:.2f} ms per step "
            f"({100 * f.cost_ms_per_step / step:.1f}% of the step): the GPU stays busy while the host waits")


def _straggler_wait(findings: List[Finding]) -> List[Tuple[Finding, Finding, str]]:
    """LoadBalancing's straggler -> CommunicationBound whose exposed communication is mostly
    the others waiting for that rank: one problem (the run-wide finding names no place)."""
    out = []
    for f in findings:
        rank = (f.evidence or {}).get("straggler_rank") if f.rule == "CommunicationBound" else None
        for p in findings if rank is not None else ():
            if p.rule == "LoadBalancing" and p.rank == rank:
                out.append((p, f, f"the exposed communication is mostly the other ranks waiting for rank {rank} "
                                   "at the collectives"))
                break
    return out


def _link(primary: Finding, secondary: Finding, why: str) -> None:
    secondary.related_to = {"rule": primary.rule, "rank": primary.rank, "why": why}
    primary.explains.append({"rule": secondary.rule, "rank": secondary.rank,
                             "cost_ms_per_step": secondary.as_dict()["cost_ms_per_step"], "why": why})


def _by_cost(f: Finding) -> float:
    c = f.cost_ms_per_step
    return -c if c is not None and c == c else 0.0


def relate(run, findings: List[Finding], params: Dict[str, dict]) -> Tuple[List[Finding], List[Finding]]:
    """(primaries, secondaries), each in the rules' order. params: every rule's parameters as used."""
    nodes = {k: str(v) for k, v in node_of(run).items()}
    where = {id(f): _scope(f, nodes) for f in findings}
    secondary = set()
    for f in findings:
        for p in sorted(findings, key=_by_cost):  # the costliest explanation first
            if p is f or id(p) in secondary or not _same_place(where[id(p)], where[id(f)]):
                continue
            for primary_rule, secondary_rule, test in RELATIONS:
                if (p.rule, f.rule) == (primary_rule, secondary_rule):
                    why = test(run, p, f, params)
                    if why:
                        _link(p, f, why)
                        secondary.add(id(f))
                        break
            if id(f) in secondary:
                break
    for p, f, why in _straggler_wait([f for f in findings if id(f) not in secondary]):
        _link(p, f, why)
        secondary.add(id(f))
    for f in findings:  # a cheap sync rides along with the rank's real problem, whatever it is
        why = None if id(f) in secondary else _minor_sync(f, params)
        if not why:
            continue
        others = [p for p in sorted(findings, key=_by_cost)
                  if p is not f and id(p) not in secondary and _same_place(where[id(p)], where[id(f)])]
        if others:
            _link(others[0], f, why)
            secondary.add(id(f))
    return ([f for f in findings if id(f) not in secondary], [f for f in findings if id(f) in secondary])


def related_markdown() -> list:
    """docs/rules.md's section on costs and related findings."""
    return ["## Cost per step and related findings", "",
            "Every finding has `cost_ms_per_step`: an estimate of the time the problem costs, per train step, "
            "averaged over the steps the rule judged (`null` where the cost is not time per step: memory growth, "
            "initialization, too many loader workers, unevenly loaded GPUs). GetNextBottleneck and Dataloader: "
            "the mean GetNext wait (the summary's figure); the GPU-utilization rules: the time the GPU idles in "
            "their windows (their share of the loop x the idle share of their time x the mean step); "
            "KernelLaunchBound: its launch gaps; HostSyncStall: the time the GPU idles after each "
            "synchronization until the next kernel starts (`evidence.gpu_idle_after_sync_ms_per_step`; the "
            "host's wait in it is no loss while the GPU is busy); StepOutlier: the outliers' excess over the "
            "median step; LoadBalancing's straggler: its net cost to the others per step; CommunicationBound: "
            "the exposed communication per step.", "",
            "Every finding also has `saving` (SPEC §7): what fixing its cause would save, `ms_per_step`, its "
            "`share` of the median train step, `low` and `high` (the 90% interval of the mean over the judged "
            "steps: a bootstrap over steps with a fixed seed, so the same run gets the same interval) and its "
            "`basis`: `what-if` where the rule replays the run without the cause, `cost` where it quotes the "
            "cost per step and no interval yet. LoadBalancing's straggler is a what-if: in each train step, "
            "the time the other ranks were blocked waiting for the rank (per other rank) less the time it was "
            "blocked waiting for them, the step's length had it arrived on time. It is judged per step, then "
            "across steps: named where that net cost is positive in more steps than chance allows (a one-sided "
            "sign test at `significance`, divided by the number of ranks) and the interval's low end is above "
            "the rule's floor (`min_ms`, `threshold_ratio` of the median step); from at least `min_steps` "
            "steps after the warm-up, leaving out the steps in which stepscope's own operator windows were "
            "open on any rank (its own cost is never a cause). Fewer steps are said in "
            "`rules_not_applicable` with the figures. Counting the collectives a rank arrives last at is not "
            "the test: a rank late once per step is last at its first collective, and the order at the others "
            "is a coin flip.", "",
            "A finding whose cost is negligible is not reported (SPEC §7): below the larger of "
            f"{MIN_COST_MS:g} ms (stepscope's own hooks cost about 10 us a step) and {100 * MIN_COST_SHARE:g}% of "
            "the median train step of the finding's process (of the run, where it names none); or worth under "
            f"{MIN_TOTAL_S:g} s over the whole run (its cost per step times that process's train steps; a "
            "rank-less finding: the ranks' mean): a tiny job's fixed costs (a worker's start, an iterator's first "
            "call) are large shares of its few milliseconds of steps, and nobody changes a script to win back a "
            "tenth of a second. Every rule's findings pass these floors, custom rules' included; the summary's "
            "JSON lists those below them under `below_cost_floor` (`rule`, `rank`, `cost_ms_per_step`, "
            "`floor_ms`, `total_s`, `floor_total_s`). Findings whose cost is not a time per step are judged by "
            "their rule's own thresholds.", "",
            "One problem is one finding. After all rules have run, a finding that another finding on the same "
            "node, GPU and rank explains is moved from `findings` to `related_findings` with `related_to` "
            "(`rule`, `rank`, `why`), and the explaining finding lists it in `explains` (`rule`, `rank`, "
            "`cost_ms_per_step`, `why`). `stepscope summary` prints it under the primary finding; "
            "`stepscope diff`, `watch` and `--fail-on` judge `findings` only. A relation is judged on the "
            f"run's figures: the primary must account for at least {EXPLAINED:g} of the secondary's cost over "
            "the same steps, so two independent problems stay two findings.", "",
            "| primary | related | when |", "| --- | --- | --- |",
            "| KernelLaunchBound | CPUBottleneck, LowGPUUtilization, BatchSize (same GPU) | launch gaps per step "
            "are at least half the GPU's idle time per step in the secondary's low windows; for CPUBottleneck "
            "also the busy CPU is the training process's own thread, not all cores (launching keeps one thread "
            "busy) |",
            "| GetNextBottleneck | CPUBottleneck, IOBottleneck, LowGPUUtilization, BatchSize (same node) | the "
            "loop's GetNext time in the steps of the secondary's low windows is at least half the GPU's idle "
            "time in them (the CPU is busy making, or the disk reading, the batches the loop waits for) |",
            "| GetNextBottleneck | Dataloader (same process) | Dataloader's too-few-workers finding: the same "
            "wait with its cause named (too many workers stays a finding of its own) |",
            "| GetNextBottleneck | StepOutlier (same process) | both found the first steps of epochs waiting for "
            "a DataLoader that starts its workers again (`evidence.epoch_start`): the outliers are that wait, "
            "which persistent_workers=True removes |",
            "| LoadBalancing (its straggler rank) | CommunicationBound | the exposed communication is mostly "
            "the others' wait for that rank (`evidence.straggler_rank`): faster communication would not help |",
            "| any finding on the same rank | HostSyncStall | its cost is below `related_below` of the step: a "
            "deliberate per-step `.item()` that leaves the GPU busy rides along with the job's real problem "
            "(alone, it is still reported when its cost is above the floor) |", "",
            "The low windows judged are those the secondary's `evidence.low_windows` lists (at most 20).", ""]
