"""LoadBalancing: in synchronous data parallelism the ranks wait for the slowest one;
and the GPUs of one node should carry the same load."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.communication import comm_tables
from stepscope.analysis.rules.base import Finding, Param, Rule, clean_rank, rank_label
from stepscope.analysis.rules.whatif import interval, saving_of, sign_test
from stepscope.analysis.rules.gpudata import memo, node_of, samples_of, train_groups, train_steps
from stepscope.analysis.tables import comm
from stepscope.analysis.store.frames import as_strings
from stepscope.core.vocabulary import COMM_P2P, TORCH_OP_WINDOW_OPEN, TORCH_OP_WINDOW_SPANS


class LoadBalancing(Rule):
    name = "LoadBalancing"
    summary = ("One rank does more work per step and the others wait for it in the gradient all-reduce (or, in "
               "a pipeline, for its stage's activations and gradients); or the "
               "GPUs of one node are unevenly busy (compute kernels from the trace, NCCL kernels left out, else "
               "NVML utilization), naming the busiest and the idlest GPU. A GPU's busy share is the busy time of "
               "its compute kernels in the steps (any mode) within the node's train loop, over the loop's length.")
    params = {
        "threshold_ratio": Param(0.10, "ratio", "fire when the slow rank's extra work per step exceeds this "
                                                "share of the median step time..."),
        "min_ms": Param(5.0, "ms", "...and this many milliseconds"),
        "warmup_steps": Param(2, "steps", "first train steps left out"),
        "significance": Param(0.01, "ratio", "with collectives recorded: the straggler's net cost to the others "
                                             "is positive in more of the judged train steps than chance allows at "
                                             "this level (a one-sided sign test over steps, corrected for the "
                                             "number of ranks; ranks that take turns are jitter, not a slow rank)"),
        "min_steps": Param(8, "steps", "judge a straggler from at least this many train steps after the warm-up "
                                       "and without stepscope's own operator windows: fewer give too wide an "
                                       "interval to name one (said in rules_not_applicable)"),
        "gpu_imbalance_ratio": Param(0.25, "ratio", "GPUs of a node: fire when the least busy GPU's busy share of "
                                                    "the loop is below the busiest one's by this fraction of it "
                                                    "(data-parallel GPUs run the same kernels: a quarter less is "
                                                    "uneven work, not noise)..."),
        "gpu_min_gap_percent": Param(10.0, "%", "...and by at least this many percentage points (two nearly idle "
                                                "GPUs are not unbalanced)"),
    }

    def not_applicable(self, run):
        train = run.steps[run.steps["mode"] == "train"]
        if train.empty:
            return "no train steps"
        if train["rank"].dropna().nunique() < 2 and not _multi_gpu(run):
            return "fewer than two ranks with train steps and no node with two GPUs measured"
        return None

    def evaluate(self, run, p):
        return self._ranks(run, p) + self._gpus(run, p)

    def why_not_judged(self, run, p):
        """A straggler not named because other processes kept its host busy, or because too
        few train steps were left to judge (their figures)."""
        judged = net_waits(run, p["warmup_steps"])
        if judged is None:
            return None
        if judged["steps_judged"] < p["min_steps"]:
            if judged["net_ms_per_step"] <= max(p["min_ms"], p["threshold_ratio"] * judged["step_ms"]):
                return None  # nothing that would have been a finding
            own = (f", {judged['steps_own']} more had stepscope's own operator windows open"
                   if judged["steps_own"] else "")
            return (f"rank {judged['rank']} cost the others {judged['net_ms_per_step']:.1f} ms a step net, judged "
                    f"from {judged['steps_judged']} train step(s) after the warm-up{own}: too few to tell a "
                    f"straggler from jitter (judged from {int(p['min_steps'])})")
        straggler = judged_straggler(run, p)
        if straggler is None or not straggler["contended"]:
            return None
        load = straggler["host"]
        return (f"rank {straggler['rank']} cost the others {straggler['net_ms_per_step']:.1f} ms a step net in "
                f"{straggler['positive_steps']} of {straggler['steps_judged']} train steps, but other "
                f"processes kept {load['other_cores']:.1f} cores of its host busy (the host "
                f"{load['busy_percent']:.0f}% busy): a rank the scheduler starves cannot be told from a slow "
                "one; judge on a host the job has to itself")

    def _gpus(self, run, p):
        out = []
        for node, source, loads, owners in _gpu_loads(run, p["warmup_steps"]):
            busy, idle = max(loads, key=loads.get), min(loads, key=loads.get)
            gap = loads[busy] - loads[idle]
            if loads[busy] <= 0 or gap / loads[busy] < p["gpu_imbalance_ratio"] or gap < p["gpu_min_gap_percent"]:
                continue
            rank = owners.get(busy)
            what = "compute kernels (NCCL left out)" if source == "kernels" else "NVML utilization"
            out.append(Finding(
                rule=self.name, rank=rank, severity="warning",
                message=(f"GPUs of {node} are unevenly loaded: {busy} is busy {loads[busy]:.0f}% of the training "
                         f"loop and {idle} only {loads[idle]:.0f}% ({what}); the others wait for {busy} or sit idle"),
                recommendation=("Give every GPU the same work: one process per GPU with DistributedDataParallel "
                                "(torchrun --nproc_per_node), evenly sized shards and batches, model-parallel "
                                "stages balanced by compute rather than by layer count, metrics and logging not "
                                "kept on one GPU; check CUDA_VISIBLE_DEVICES if a GPU is not used at all."),
                evidence={"node": node, "source": source, "busiest_gpu": busy, "idlest_gpu": idle,
                          "busy_percent": {g: round(v, 1) for g, v in loads.items()},
                          "imbalance_ratio": round(gap / loads[busy], 3),
                          "ranks": {g: r for g, r in owners.items() if r is not None}}))
        return out

    def _ranks(self, run, p):
        # Fast ranks wait for the slow one inside Backward (DDP's all-reduce runs in
        # backward hooks), so a rank's own work per step is its step time outside
        # Backward: the rank with the most is the one the others wait for. Where the
        # collectives were recorded, the straggler is named by its cost to the others:
        # the time they were blocked waiting for it to arrive (analysis/communication.py).
        per_rank = {}
        for (process, rank), s in train_groups(run):  # (split once per run; the ranks known only)
            if pd.isna(rank):
                continue
            s = s.sort_values("start_ns").iloc[int(p["warmup_steps"]):]
            if len(s):
                work = (s["duration_ns"] - s["Backward"]).to_numpy(dtype=float)
                per_rank[int(rank)] = (float(np.median(work)), process, float(s["duration_ns"].median()))
        if len(per_rank) < 2:
            return []
        step_ms = float(np.median([v[2] for v in per_rank.values()])) / 1e6
        work = {str(r): round(v[0] / 1e6, 3) for r, v in sorted(per_rank.items())}
        if net_waits(run, p["warmup_steps"]) is not None:  # collectives recorded: judged by the net cost
            judged = judged_straggler(run, p)
            # (contention for the CPU is not the rank's own work: why_not_judged says so)
            if judged is None or judged["contended"]:
                return []
            slow, cost, saving = judged["rank"], judged["net_ms_per_step"], judged["saving"]
            # material: the lower end of its interval over the steps above the floor (few or
            # mixed steps make the interval wide, and then no rank is named)
            if saving["low"] <= max(p["min_ms"], p["threshold_ratio"] * step_ms):
                return []
            stages = pipelined(run)
            return [Finding(
                rule=self.name, rank=clean_rank(slow), severity="warning",
                message=(f"rank {slow} is the straggler: in {judged['positive_steps']} of {judged['steps_judged']} "
                         "train steps the other rank(s) wait for it longer than it waits for them, "
                         f"{judged['waited_ms_per_step']:.1f} ms per step against {judged['own_wait_ms_per_step']:.1f}"
                         f" ms: {cost:.1f} ms a step net ({100 * cost / step_ms:.0f}% of a {step_ms:.1f} ms step; "
                         f"it arrives last at {judged['last_at']} of {judged['of']} "
                         f"{'transfers' if stages else 'collectives'})"),
                recommendation=(_EVEN_OUT_STAGES if stages else _EVEN_OUT).format(rank=slow),
                evidence={"slow_rank": slow, "waited_ms_per_step": judged["waited_ms_per_step"], "pipeline": stages,
                          "own_wait_ms_per_step": judged["own_wait_ms_per_step"], "net_ms_per_step": cost,
                          "waited_ms": judged["waited_ms"], "last_at": judged["last_at"],
                          "collectives": judged["of"], "last_share": judged["last_share"],
                          "steps_judged": judged["steps_judged"], "positive_steps": judged["positive_steps"],
                          "p_value": judged["p_value"], "steps_own_windows": judged["steps_own"],
                          "outside_train_steps": judged["outside"], "step_ms_median": round(step_ms, 3),
                          "host": judged["host"],
                          "work_outside_backward_ms": work},
                cost_ms_per_step=cost, saving=saving_of(saving, step_ms))]
        slow = max(per_rank, key=lambda r: per_rank[r][0])
        others = [v[0] for r, v in per_rank.items() if r != slow]
        extra = per_rank[slow][0] - float(np.median(others))
        if extra / 1e6 <= max(p["min_ms"], p["threshold_ratio"] * step_ms):
            return []
        return [Finding(
            rule=self.name, rank=clean_rank(slow), severity="warning",
            message=(f"rank {slow} may be a straggler: it spends {extra / 1e6:.1f} ms longer per step outside "
                     f"Backward than the other {len(others)} rank(s) ({100 * extra / 1e6 / step_ms:.0f}% of a "
                     f"{step_ms:.1f} ms step); no collective was recorded, so who waits for whom is not measured "
                     "(in data parallelism the others would wait for it in the gradient all-reduce)"),
            recommendation=_EVEN_OUT.format(rank=slow),
            evidence={"slow_rank": slow, "extra_ms_per_step": round(extra / 1e6, 3),
                      "step_ms_median": round(step_ms, 3), "work_outside_backward_ms": work},
            cost_ms_per_step=extra / 1e6)]


# Other processes than the job's keeping this many cores of the straggler's host busy through
# the loop: its ranks compete with them for the CPU, and a rank the scheduler starves is last
# at every collective (seen: 17 and 18 of 18) though its work is the others'. Not judged then.
CONTENDED_CORES = 0.5


def others_load(run, process) -> Optional[dict]:
    """How busy ``process``'s host was over its train steps, and how much of that was other
    processes than the job's ranks (and their children): {"busy_percent", "other_cores"};
    None where the samples are missing."""
    if process is None:
        return None
    cpu, own = samples_of(run, "cpu_util"), samples_of(run, "proc_cpu_percent")
    steps = run.steps[(as_strings(run.steps["process"]) == str(process)) & (run.steps["mode"] == "train")]
    if cpu.empty or own.empty or steps.empty:
        return None
    nodes = node_of(run)
    node, t0, t1 = nodes.get(str(process)), steps["start_ns"].min(), steps["end_ns"].max()
    cores = cpu[(cpu["node"] == node) & cpu["device"].astype(str).str.fullmatch(r"cpu\d+").to_numpy()
                & (cpu["timestamp_ns"] >= t0) & (cpu["timestamp_ns"] <= t1)]
    ranks = {str(q) for q in run.steps.loc[run.steps["rank"].notna(), "process"].unique() if nodes.get(str(q)) == node}
    job = own[own["process"].astype(str).isin(ranks) & (own["timestamp_ns"] >= t0) & (own["timestamp_ns"] <= t1)]
    if cores.empty or job.empty:
        return None
    busy_cores = float(cores.groupby("timestamp_ns")["value"].sum().mean()) / 100
    job_cores = float(job.groupby(["process", "timestamp_ns"])["value"].sum().groupby("process").mean().sum()) / 100
    n = cores["device"].nunique()
    return {"busy_percent": round(100 * busy_cores / max(n, 1), 1), "other_cores": round(busy_cores - job_cores, 2)}


def judged_straggler(run, p) -> Optional[dict]:
    """``net_waits``' figures of the rank that costs the others most, judged per step: from
    ``min_steps`` train steps or more, its net cost positive in more of them than chance
    allows (``sign_test`` at ``significance``, over the ranks that could have been
    named); with ``host`` (``others_load``) and ``contended``: other processes kept its host
    busy, and no rank is named. None where no rank is a straggler so judged."""
    judged = net_waits(run, p["warmup_steps"])
    if judged is None or judged["steps_judged"] < p["min_steps"]:
        return None
    if judged["p_value"] >= p["significance"] / max(judged["ranks"], 1):
        return None
    process = next((q for (q, r), _ in train_groups(run) if not pd.isna(r) and int(r) == judged["rank"]), None)
    load = others_load(run, process)
    return {**judged, "host": load, "contended": load is not None and load["other_cores"] >= CONTENDED_CORES}


def net_waits(run, warmup_steps) -> Optional[dict]:
    """Who the ranks wait for inside their train steps, per step, or None where no
    collective of two ranks or more was recorded there.

    Only the collectives a rank enters inside one of its train steps (after the warm-up)
    are judged: a wait at set-up (a rank loading a checkpoint while the others meet it at a
    broadcast), in validation or at a checkpoint is no cost of a train step; its total is
    reported apart (``outside``). Nor are the steps in which stepscope's own operator
    windows were open on any rank (``steps_own``): stepscope's cost is never a cause.

    In each judged step, a rank's net cost is the time the others were blocked waiting for
    it (per other rank) less the time it was blocked waiting for them: what the step would
    have been shorter had it arrived on time, where the order is not a coin flip. The
    straggler is the rank whose mean net cost per step is highest; ``saving`` is that mean
    with its interval over the steps (``interval``), ``positive_steps`` the steps in which
    its net cost was positive and ``p_value`` the chance of as many under jitter
    (``sign_test``). Counting the collectives it arrived last at would be the wrong
    statistic: a rank late once per step is last at the step's first collective, and at
    the others the order is a coin flip. Computed once per run (LoadBalancing and
    CommunicationBound both ask)."""
    return memo(run, ("net_waits", float(warmup_steps)), lambda: _net_waits(run, warmup_steps))


def _net_waits(run, warmup_steps) -> Optional[dict]:
    colls, blocked = comm_tables(run)
    if not len(colls):
        return None
    steps = train_steps(run, warmup_steps)
    inside = np.zeros(len(colls), dtype=bool)
    step_of = np.full(len(colls), -1, dtype=np.int64)
    issuers = np.asarray(as_strings(colls["process"]))
    for process, s in steps.groupby(as_strings(steps["process"]), sort=False):
        mine = issuers == process
        if not mine.any():
            continue
        s = s.sort_values("start_ns")
        starts, ends = s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64)
        at = colls["start_ns"].to_numpy(np.int64)[mine]
        k = np.searchsorted(starts, at, side="right") - 1
        kk = np.clip(k, 0, len(ends) - 1)
        inside[np.flatnonzero(mine)] = (k >= 0) & (at < ends[kk])
        step_of[np.flatnonzero(mine)] = s["step"].to_numpy(np.int64)[kk]
    arr = comm.arrivals(colls[inside].assign(step=step_of[inside]), blocked)
    if not len(arr):
        return None
    outside = comm.arrivals(colls[~inside], blocked)
    own_steps = _own_window_steps(run, steps) & set(int(x) for x in arr["step"].unique())
    step_ms = float(steps["duration_ns"].median()) / 1e6 if len(steps) else 0.0
    return {**per_step_straggler(arr, blocked, own_steps), "step_ms": step_ms, "steps_own": len(own_steps),
            "outside": {"collectives": int(outside.groupby(["group", "seq"]).ngroups) if len(outside) else 0,
                        "waited_ms": round(float(outside["waited_ns"].sum()) / 1e6, 3) if len(outside) else 0.0}}


def per_step_straggler(arr: pd.DataFrame, blocked: pd.DataFrame, left_out=frozenset()) -> dict:
    """The rank that costs the others most, judged per step, from the collectives' arrivals
    (``comm.arrivals``, with each one's step) and the blocked intervals; the steps in
    ``left_out`` are not judged (net_waits says why)."""
    of = int(arr.groupby(["group", "seq"]).ngroups)
    ranks = sorted(int(r) for r in arr["rank"].unique())
    judged_steps = sorted(set(int(x) for x in arr["step"].unique()) - set(left_out))
    net, waited, own = _nets(comm.waits_by_step(arr, blocked), ranks, judged_steps)
    last_at = arr[arr["rank"] == arr["last_rank"]].groupby("last_rank").size()
    rank = max(ranks, key=lambda r: (float(net[r].mean()) if len(judged_steps) else 0.0, -r))
    values = net[rank].to_numpy() / 1e6
    positive, negative = int((values > 0).sum()), int((values < 0).sum())
    mean = float(values.mean()) if len(values) else 0.0
    low, high = interval(values)

    def per_step(frame):
        return round(float(frame[rank].mean()) / 1e6, 3) if len(judged_steps) else 0.0

    return {"rank": rank, "ranks": len(ranks), "last_at": int(last_at.get(rank, 0)), "of": of,
            "last_share": round(int(last_at.get(rank, 0)) / max(of, 1), 3),
            "waited_ms": round(float(waited[rank].sum()) / 1e6, 3), "waited_ms_per_step": per_step(waited),
            "own_wait_ms_per_step": per_step(own), "net_ms_per_step": round(mean, 3),
            "steps_judged": len(judged_steps), "positive_steps": positive, "p_value": sign_test(positive, negative),
            "saving": {"ms_per_step": round(mean, 3), "low": round(low, 3), "high": round(high, 3)}}


def _nets(waits: pd.DataFrame, ranks: list, steps: list) -> tuple:
    """(net, waited, own): per judged step (index) and rank (columns), in ns: the time the
    others waited for the rank per other rank, the time it waited for them, and the first
    less the second."""
    zero = pd.DataFrame(0.0, index=pd.Index(steps, name="step"), columns=ranks)
    w = waits[waits["step"].isin(steps)]
    others = max(len(ranks) - 1, 1)
    waited = zero.add(w.pivot_table(index="step", columns="last_rank", values="waited_ns", aggfunc="sum")
                      .reindex(index=zero.index, columns=ranks).fillna(0.0) / others, fill_value=0.0)
    own = zero.add(w.pivot_table(index="step", columns="rank", values="waited_ns", aggfunc="sum")
                   .reindex(index=zero.index, columns=ranks).fillna(0.0), fill_value=0.0)
    return waited - own, waited, own


def _own_window_steps(run, steps: pd.DataFrame) -> set:
    """The train step numbers in which stepscope's own PyTorch operator windows were open on
    some rank: from a window's opening to its closing (its sampled steps, slowed by torch's
    profiler, and the step in which it closed, reading every operator)."""
    spans = run.select(categories=["framework"], names=list(TORCH_OP_WINDOW_SPANS),
                       columns=["process", "name", "start_ns", "end_ns"])
    if not len(spans) or not len(steps):
        return set()
    out = set()
    spans = spans.assign(process=as_strings(spans["process"])).sort_values("start_ns", kind="stable")
    for process, s in steps.groupby(as_strings(steps["process"]), sort=False):
        w = spans[spans["process"] == process]
        if not len(w):
            continue
        s = s.sort_values("start_ns")
        starts, ends, numbers = (s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64),
                                 s["step"].to_numpy(np.int64))
        opened = None
        for name, t0, t1 in zip(w["name"], w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)):
            if name == TORCH_OP_WINDOW_OPEN:
                opened = t0 if opened is None else opened
                continue
            lo = t0 if opened is None else opened
            out.update(int(x) for x in numbers[(starts < t1) & (ends > lo)])
            opened = None
        if opened is not None:  # open to the loop's end
            out.update(int(x) for x in numbers[ends > opened])
    return out


_EVEN_OUT = ("Even out the work: look at what rank {rank} does that the others do not (extra logging or evaluation on "
             "one rank, uneven batch sizes or sequence lengths, a slower device or host, data loading on a busy "
             "node).")
# where most of the traffic is point-to-point (a pipeline): the stages wait for their slowest neighbour
_EVEN_OUT_STAGES = ("Balance the pipeline's stages: rank {rank}'s stage takes longest, and its neighbours wait for "
                    "its activations or gradients. Move layers from it to the other stages (the split points), so "
                    "that each stage's forward and backward take about the same time; more microbatches per step, "
                    "or an interleaved schedule (ScheduleInterleaved1F1B), shrink the bubbles that remain.")


def pipelined(run) -> bool:
    """Whether most of the recorded traffic is point-to-point (pipeline stages)."""
    colls = comm_tables(run)[0]
    return bool(len(colls)) and float(colls["group"].astype(str).str.startswith(COMM_P2P).mean()) >= 0.5


def _multi_gpu(run) -> bool:
    k = run.kernel_names
    if len(k) and (k.groupby("process", observed=True)["device"].nunique().max() > 1 or k["process"].nunique() > 1):
        return True
    util = samples_of(run, "gpu_util")
    return bool(len(util)) and util.groupby("node")["device"].nunique().max() > 1


def _gpu_loads(run, warmup_steps):
    """Per node with two or more GPUs measured: (node, source, {gpu: busy %}, {gpu: rank}).
    Compute kernels (their busy time in the steps of the node's loop) where traced, as
    they tell real work from waiting in NCCL; NVML utilization means otherwise."""
    util = samples_of(run, "gpu_util")
    if not len(run.kernel_steps) and not len(util):  # nothing measured of a GPU
        return []
    steps = train_steps(run, warmup_steps)
    if steps.empty:
        return []
    nodes = node_of(run)
    steps = steps.assign(node=steps["process"].map(nodes))
    k = run.kernel_steps
    if len(k):  # each step's kernels with the step's time
        spans = run.steps[["process", "mode", "step", "start_ns", "end_ns"]]
        # joined on the names as plain strings (a categorical's converted once, not row by row)
        k = k[["process", "device", "mode", "step", "busy_ns"]].assign(
            process=as_strings(k["process"]), mode=as_strings(k["mode"])).merge(
            spans.assign(process=as_strings(spans["process"]), mode=as_strings(spans["mode"])),
            on=["process", "mode", "step"])
        k = k.assign(node=k["process"].map(nodes))
    out = []
    for node, s in steps.groupby("node", sort=True):
        t0, t1 = int(s["start_ns"].min()), int(s["end_ns"].max())
        ranks = dict(s[["process", "rank"]].drop_duplicates("process").itertuples(index=False))
        kn = k[(k["node"] == node) & (k["start_ns"] >= t0) & (k["end_ns"] <= t1)] if len(k) else k
        if len(kn) and len(kn.groupby(["process", "device"])) > 1:
            label = pd.Series(as_strings(kn["process"]), index=kn.index) + ":" + kn["device"].astype(str)
            pairs = kn[["process", "device"]].drop_duplicates()
            several = pairs["process"].nunique() > 1
            names = {f"{p}:{d}": (f"GPU {d} of {rank_label(ranks.get(p), p)}" if several else f"gpu{d}")
                     for p, d in zip(pairs["process"], pairs["device"])}
            busy = kn["busy_ns"].groupby(label.to_numpy()).sum()
            loads = {names[g]: 100 * float(v) / (t1 - t0) for g, v in busy.items()}
            owners = {names[g]: clean_rank(ranks.get(g.rsplit(":", 1)[0])) for g in busy.index}
            out.append((node, "kernels", loads, owners))
            continue
        un = util[(util["node"] == node) & (util["timestamp_ns"] >= t0) & (util["timestamp_ns"] <= t1)]
        if un["device"].nunique() > 1:
            loads = {str(g): float(v) for g, v in un.groupby("device")["value"].mean().items()}
            only = clean_rank(s["rank"].iloc[0]) if s["process"].nunique() == 1 else None
            out.append((node, "nvml", loads, {g: only for g in loads} if only is not None else {}))
    return out
