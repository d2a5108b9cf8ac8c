"""CommunicationBound: the training loop waits on collectives for a large share of its steps."""

from __future__ import annotations

from typing import Optional

import numpy as np

from stepscope.analysis.communication import communication, gpu_communication
from stepscope.analysis.rules.balance import CONTENDED_CORES, LoadBalancing, judged_straggler, others_load
from stepscope.analysis.rules.base import Finding, Param, Rule
from stepscope.analysis.rules.gpudata import memo, train_steps
from stepscope.analysis.rules.whatif import per_step_saving
from stepscope.analysis.store.frames import as_strings


class CommunicationBound(Rule):
    name = "CommunicationBound"
    summary = ("The processes spend a large share of their train steps blocked on collectives (exposed "
               "communication: waiting in Work.wait, in a synchronous torch.distributed call, or in DDP's wait for "
               "its last gradient bucket at the end of backward), time not hidden behind computation; with NCCL, "
               "where the host does not wait, the GPUs running NCCL kernels with no compute kernel. The advice "
               "follows the cause: a rank the others wait for, buckets that start too late, synchronous calls in "
               "the loop, FSDP's gathers.")
    params = {
        "threshold": Param(0.10, "ratio", "fire when exposed communication (the host's, or the GPUs' where larger) "
                                          "exceeds this share of train step time"),
        "straggler_share": Param(0.5, "ratio", "name a straggler rank as the cause when the others' wait for it is "
                                               "at least this share of the exposed communication"),
        "warmup_steps": Param(2, "steps", "each rank's first train steps left out (DDP builds and rebuilds its "
                                          "buckets, gloo and NCCL connect)"),
        "min_steps": Param(8, "steps", "judge only where every rank has at least this many train steps after "
                                       "the warm-up..."),
        "min_seconds": Param(0.2, "s", "...lasting at least this long: a loop of a few milliseconds cannot tell "
                                       "communication from start-up and scheduling"),
    }

    def not_applicable(self, run):
        if not (run.steps["mode"] == "train").any():
            return "no train steps"
        if communication(run) is None:
            return "no collectives recorded (a job that is not distributed, or not through torch.distributed)"
        return None

    def why_not_judged(self, run, p):
        return self._judge(run, p)[1]

    def _judge(self, run, p) -> tuple:
        """(the judged figures where the loop is communication-bound, else None; why it was
        not judged though over the threshold, else None). Judged over the train steps after
        each rank's warm-up; once per run and parameters."""
        return memo(run, ("CommunicationBound", tuple(sorted(p.items()))), lambda: _judged(run, p))

    def evaluate(self, run, p):
        c = communication(run)
        judged = self._judge(run, p)[0]
        if c is None or judged is None:
            return []
        # judged after the warm-up; quoted as the summary gives it (SPEC §7: a finding's figures are the summary's)
        gpu = c.get("gpu")
        on_gpu = judged["on_gpu"] and gpu is not None
        share = gpu["exposed_share"] if on_gpu else c["exposed_share"]
        exposed_ms = gpu["exposed_ms_per_step"] if on_gpu else c["exposed_ms_per_step"]
        kinds = sorted(c["by_kind"].items(), key=lambda kv: -kv[1]["total_ms"])
        main_kind = kinds[0][0] if kinds else "collectives"
        phase = max(c["by_phase"], key=lambda k: c["by_phase"][k]["exposed_ms"]) if c["by_phase"] else None
        straggling = judged_straggler(run, LoadBalancing.defaults())
        if straggling is not None and straggling["contended"]:
            straggling = None  # other processes kept the host busy: no rank is blamed (LoadBalancing says why)
        cause, advice, straggler = _cause(c, p, main_kind, phase, straggling)
        where = f", mostly in {phase} waiting for {c['by_phase'][phase]['kind']}" if phase else ""
        if on_gpu:
            what = (f"the GPUs run nothing but communication {100 * share:.0f}% of train step time ({exposed_ms:.2f} "
                    f"ms a step: NCCL kernels with no compute kernel beside them, of {100 * gpu['share']:.0f}% "
                    "with a NCCL kernel running)")
        else:
            what = (f"the loop is blocked on communication {100 * share:.0f}% of train step time "
                    f"({exposed_ms:.2f} ms a step{where}); of {100 * c['share']:.0f}% with a collective in flight, "
                    f"{100 * c['overlapped_share']:.0f}% is hidden behind work")
        return [Finding(
            rule=self.name, rank=None, severity="warning",
            message=f"{what}. {cause}",
            recommendation=advice,
            evidence={"exposed_share": c["exposed_share"], "share": c["share"], "gpu": gpu, "on_gpu": on_gpu,
                      "judged": {k: judged[k] for k in ("share", "steps", "seconds", "warmup_steps")},
                      "overlapped_share": c["overlapped_share"], "exposed_ms_per_step": exposed_ms,
                      "by_phase": c["by_phase"], "by_kind": c["by_kind"], "waited_for": c["waited_for"][:4],
                      "sources": c["sources"], "cause": cause, "straggler_rank": straggler},
            cost_ms_per_step=exposed_ms, saving=None if on_gpu else _overlap_saving(run, p))]


def _overlap_saving(run, p) -> Optional[dict]:
    """What overlap could hide, step by step: each judged train step's exposed communication,
    bounded by the computation beside it (its phases' time less that wait: a collective
    hides behind work only as long as there is work)."""
    steps = train_steps(run, p["warmup_steps"])
    if not len(steps):
        return None
    exposed = steps["comm_exposed_ns"].to_numpy(dtype=float)
    phases = [c for c in ("Forward", "Loss", "Backward", "Optimizer") if c in steps]
    compute = np.maximum(steps[phases].sum(axis=1).to_numpy(dtype=float) - exposed, 0.0)
    return per_step_saving(np.minimum(exposed, compute) / 1e6, float(steps["duration_ns"].median()) / 1e6)


def _judged(run, p) -> tuple:
    steps = train_steps(run, p["warmup_steps"])
    c = communication(run)
    if c is None or not len(steps):
        return None, None
    total = float(steps["duration_ns"].sum())
    host_share = float(steps["comm_exposed_ns"].sum()) / total if total > 0 else 0.0
    gpu = gpu_communication(run, steps)
    on_gpu = gpu is not None and gpu["exposed_share"] > host_share  # NCCL: the host does not wait
    share = gpu["exposed_share"] if on_gpu else round(host_share, 4)
    if share <= p["threshold"]:
        return None, None
    ranked = steps[steps["rank"].notna()]
    per = (ranked if len(ranked) else steps).groupby(as_strings((ranked if len(ranked) else steps)["process"]))
    counts, seconds = per.size(), per["duration_ns"].sum() / 1e9
    what = f"the loop is blocked on communication {100 * share:.0f}% of its train step time"
    if int(counts.min()) < p["min_steps"] or float(seconds.min()) < p["min_seconds"]:
        return None, (f"{what}, but a rank has only {int(counts.min())} train steps ({float(seconds.min()):.2f} s) "
                      f"after its first {int(p['warmup_steps'])}: too few to tell communication from start-up and "
                      f"scheduling (judged from {int(p['min_steps'])} steps and {p['min_seconds']:g} s a rank)")
    if not on_gpu:
        busy = _contended_host(run, list(counts.index))
        if busy is not None:
            return None, (f"{what}, but {busy['process']}'s host was {busy['busy_percent']:.0f}% busy over its train "
                          f"steps ({busy['other_cores']:.1f} cores by other processes): there a collective waits "
                          "for a CPU as much as for its peers; judge on a host with a core to spare per rank")
    return {"share": share, "on_gpu": on_gpu, "steps": int(len(steps)), "seconds": round(float(seconds.sum()), 3),
            "warmup_steps": int(p["warmup_steps"])}, None


def _contended_host(run, processes) -> Optional[dict]:
    """The first rank process whose host other processes kept busy over its train steps
    (``others_load``, as LoadBalancing asks), with its figures; None where none was, or the
    samples are missing. The job's own compute does not count: the exposed time of a job
    that keeps its cores busy is its own."""
    for process in processes:
        load = others_load(run, process)
        if load is not None and load["other_cores"] >= CONTENDED_CORES:
            return {"process": str(process), **load}
    return None


def _cause(c: dict, p: dict, kind: str, phase, judged) -> tuple:
    """(what causes it, what to do, the straggler rank or None), from what the collectives show;
    ``judged``: who the ranks wait for inside train steps (LoadBalancing's figures)."""
    top = judged  # (LoadBalancing's judgement, per step; the host not contended)
    exposed = c["exposed_ms_per_step"]
    counts = {k: v.get("count", 0) for k, v in c["by_kind"].items()}
    pipeline = 2 * (counts.get("send", 0) + counts.get("recv", 0)) >= sum(counts.values()) > 0
    if top and exposed > 0 and top["waited_ms_per_step"] >= p["straggler_share"] * exposed and pipeline:
        return (f"Most of it is waiting for rank {top['rank']}: in {top['positive_steps']} of "
                f"{top['steps_judged']} train steps the others wait for its transfers longer than it waits for "
                f"theirs ({top['waited_ms_per_step']:.2f} ms a step of the others'): its pipeline stage takes "
                "longest.",
                f"Balance the pipeline's stages: move layers from rank {top['rank']}'s stage to the others (the "
                "split points), so that each stage's forward and backward take about the same time; more "
                "microbatches per step, or an interleaved schedule (ScheduleInterleaved1F1B), shrink the bubbles "
                "that remain.", top["rank"])
    if top and exposed > 0 and top["waited_ms_per_step"] >= p["straggler_share"] * exposed:
        return (f"Most of it is waiting for rank {top['rank']}: in {top['positive_steps']} of "
                f"{top['steps_judged']} train steps the others wait for it longer than it waits for them "
                f"({top['waited_ms_per_step']:.2f} ms a step of the others'): a straggler.",
                f"Even out the work of rank {top['rank']}: what it does that the others do not (logging, evaluation "
                "or checkpointing on one rank, uneven batches or sequence lengths, a slower host or device, a busy "
                "data loader). Faster communication will not help while the others wait for it.", top["rank"])
    ddp = c["sources"]["ddp"]
    broadcast = c["by_kind"].get("broadcast", {})
    if kind == "broadcast" and broadcast.get("ddp", 0) * 2 >= broadcast.get("count", 0) > 0:
        return ("DDP broadcasts the module's buffers (batch-norm statistics) from rank 0 before every forward "
                "(broadcast_buffers=True, its default), and the loop waits for it.",
                "Where the buffers need no synchronization every step (no batch norm, or SyncBatchNorm, or "
                "statistics that may differ per rank), construct DDP with broadcast_buffers=False; otherwise "
                "synchronize them less often yourself.", None)
    if ddp and phase == "Backward":
        per_step = ddp / max(c["steps"], 1)
        return (f"DDP's gradient all-reduce ends after backward's computation ({per_step:.1f} bucket(s) a step): "
                "its buckets are not overlapped with backward.",
                "Let DDP start all-reducing earlier: a smaller bucket_cap_mb (default 25; a single large bucket "
                "starts only when backward is done), gradient_as_bucket_view=True (no copy into buckets), and no "
                "synchronization in backward (a .item() or a hook that waits) that holds the buckets back. With "
                "gradient accumulation, run the micro-batches but the last under model.no_sync() so that only one "
                "all-reduce a step happens. Compression (the fp16 or bf16 comm hook, PowerSGD) cuts the bytes.", None)
    if kind in ("send", "recv"):
        return ("The pipeline's stages wait for each other's activations and gradients (point-to-point send and "
                "recv): the bubbles of its schedule.",
                "Use more microbatches per step than stages (four times as many or more), an interleaved or "
                "zero-bubble schedule (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble), and stages that "
                "take about the same time; where the bubble stays, fewer stages and more data parallelism.", None)
    if kind in ("all_gather", "reduce_scatter"):
        return ("FSDP-style gathers and reduce-scatters are waited on rather than prefetched.",
                "With FSDP2 (fully_shard), prefetch the next layer's all-gather (set_modules_to_forward_prefetch, "
                "set_modules_to_backward_prefetch), keep the root unsharded after forward "
                "(reshard_after_forward=False for the last blocks), and shard fewer, larger modules.", None)
    return (f"Synchronous {kind} calls in the loop block it until every rank arrives.",
            f"Issue {kind} with async_op=True and wait for it only when its result is needed, or less often (a loss "
            "reduced for logging every N steps, not every step); several small tensors in one call, not one each.",
            None)
