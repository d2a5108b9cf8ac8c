"""A run's communication, as the summary, the rules and the report give it.

``communication(run)`` (None for a run without collectives):

* over the train steps (the steps the phase shares are over): the share of step time
  with a collective in flight, the exposed share (the process blocked on one) and the
  overlapped share, and what that costs a step;
* per phase, the exposed time inside it ("Backward 41% ... of which waiting for
  all_reduce 9%"), and the kind of collective in flight then;
* per kind: collectives, bytes, time in flight;
* on a GPU, the NCCL kernels: the share of step time a GPU ran one, and the share it
  ran nothing but communication (``gpu_communication``);
* who waits for whom: per rank that arrived last, the time the others were blocked
  waiting for it (``comm.arrivals``, ``comm.waited_for``), in all and per step of a
  waiting rank;
* ``left_out``: the traffic the figures leave out (``unrecorded``): collectives seen
  among the sampled operators that no recorded call made (a compiled graph's).

The tables and their definitions are in ``analysis/tables/comm.py``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.quantities import summary_steps
from stepscope.analysis.tables import comm
from stepscope.core import decoding
from stepscope.core.vocabulary import PHASES

def _ms(ns) -> float:
    return round(float(ns) / 1e6, 3)


def comm_tables(run):
    """(collectives, waits), computed once per loaded run."""
    def build():
        events = run.select(categories=["comm"])
        colls = comm.collectives(events)
        return colls, comm.waits(events, colls)

    return run.memo("comm_tables", build)


def gpu_communication(run, steps: pd.DataFrame) -> Optional[dict]:
    """The device side, from the NCCL kernels (``kernel_steps``): the share of the steps'
    time a GPU ran one, and the share it ran only communication (no compute kernel):
    what NCCL's exposed communication costs, which the host does not see (it does not
    block in a NCCL wait). Per step of a process, its GPUs' mean."""
    ks = run.kernel_steps
    if not len(ks) or "comm_kernel_ns" not in ks or not ks["comm_kernel_ns"].any() or not len(steps):
        return None
    key = ["process", "mode", "step"]
    k = ks[[*key, "device", "comm_kernel_ns", "comm_exposed_kernel_ns"]].astype({"process": str, "mode": str})
    s = steps[key].astype({"process": str, "mode": str})
    k = k.merge(s, on=key)
    if not len(k):
        return None
    devices = k.groupby("process")["device"].nunique()
    per = k.groupby("process")[["comm_kernel_ns", "comm_exposed_kernel_ns"]].sum().div(devices, axis=0).sum()
    total = float(steps["duration_ns"].sum())
    return {"share": round(float(per["comm_kernel_ns"]) / total, 4),
            "exposed_share": round(float(per["comm_exposed_kernel_ns"]) / total, 4),
            "exposed_ms_per_step": _ms(per["comm_exposed_kernel_ns"] / len(steps))}


# The operators of collectives and point-to-point traffic as torch's profiler names them
# (the sampled operator windows), but for the waits and wrappers around them.
TRAFFIC_OPS = ("_c10d_functional::", "_c10d_functional_autograd::", "c10d::")
NOT_TRAFFIC = ("wait_tensor", "_wrap_tensor_autograd", "wait", "barrier_like")
LEFT_OUT_NOTE = ("collectives that ran where no recorded call made them: inside a compiled graph (inductor "
                 "emits them; no Python wrapper runs there) or from a C++ extension; seen in the sampled steps' "
                 "operators, they are not in the communication figures")


def unrecorded(run, colls: pd.DataFrame) -> Optional[dict]:
    """The traffic the numbers leave out: operators of collectives in the sampled operator
    windows that no recorded call encloses ({"ops": {name: count}, "note"}), or None."""
    names = [n for n in run.event_names(containing="c10d")
             if n.startswith(TRAFFIC_OPS) and n.rsplit("::", 1)[-1] not in NOT_TRAFFIC]
    if not names:
        return None
    ops = run.select(categories=["op"], names=names, columns=["process", "name", "start_ns"])
    if not len(ops):
        return None
    proc = ops["process"].astype(str).to_numpy()
    at = ops["start_ns"].to_numpy(np.int64)
    inside = np.zeros(len(ops), dtype=bool)
    for p, c in colls.groupby("process", sort=False):
        rows = np.flatnonzero(proc == str(p))
        if not len(rows):
            continue
        s, e = comm.union(c["start_ns"].to_numpy(np.int64), c["issued_ns"].to_numpy(np.int64))
        i = np.searchsorted(s, at[rows], side="right") - 1
        inside[rows] = (i >= 0) & (at[rows] <= e[np.maximum(i, 0)])
    left = ops["name"].astype(str)[~inside]
    if not len(left):
        return None
    return {"ops": {str(k): int(v) for k, v in left.value_counts().items()}, "note": LEFT_OUT_NOTE}


def communication(run) -> Optional[dict]:
    colls, blocked = comm_tables(run)
    steps = summary_steps(run.steps)  # the steps the phase shares are over
    gpu = gpu_communication(run, steps)
    left_out = unrecorded(run, colls)
    if not len(colls) and gpu is None and left_out is None:
        return None
    total = float(steps["duration_ns"].sum()) if len(steps) else 0.0
    n = max(len(steps), 1)
    out = {
        "collectives": int(len(colls)),
        "bytes": int(colls["bytes"].sum()),
        "steps": int(len(steps)),
        "share": round(float(steps["comm_ns"].sum()) / total, 4) if total else 0.0,
        "exposed_share": round(float(steps["comm_exposed_ns"].sum()) / total, 4) if total else 0.0,
        "overlapped_share": round(float(steps["comm_overlapped_ns"].sum()) / total, 4) if total else 0.0,
        "ms_per_step": _ms(steps["comm_ns"].sum() / n) if len(steps) else 0.0,
        "exposed_ms_per_step": _ms(steps["comm_exposed_ns"].sum() / n) if len(steps) else 0.0,
        "by_kind": {}, "by_phase": {}, "waited_for": [],
        "sources": {"ddp": int(colls["ddp"].sum()), "calls": int((~colls["ddp"]).sum())},
    }
    if gpu is not None:
        out["gpu"] = gpu
    if left_out is not None:
        out["left_out"] = left_out  # traffic the figures leave out, named (SPEC §6)
    for kind, c in colls.groupby("kind", sort=False):
        out["by_kind"][str(kind)] = {"count": int(len(c)), "bytes": int(c["bytes"].sum()),
                                     "total_ms": _ms(c["duration_ns"].sum()),
                                     "async": int(c["is_async"].sum()), "ddp": int(c["ddp"].sum())}
    if len(steps) and len(colls):
        out["by_phase"] = _exposed_by_phase(run, colls, blocked, steps, total)
    arr = run.memo("comm_arrivals", lambda: comm.arrivals(colls, blocked))
    ranks = steps["rank"].dropna().astype(int).value_counts() if len(steps) else pd.Series(dtype=int)
    for row in comm.waited_for(arr, blocked).itertuples():
        if row.waited_ns <= 0:
            continue
        others = int(ranks.sum() - ranks.get(int(row.rank), 0))  # the steps of the ranks that waited
        out["waited_for"].append({"rank": int(row.rank), "last_at": int(row.last_at),
                                  "of": int(arr.groupby(["group", "seq"]).ngroups),
                                  "waited_ms": _ms(row.waited_ns),
                                  "ms_per_step": _ms(row.waited_ns / max(others, 1))})
    return out


def _exposed_by_phase(run, colls, blocked, steps, total) -> dict:
    """{phase: {exposed_ms, share (of step time), kind}}: the exposed communication inside
    each canonical phase of the steps, and the kind of collective mostly in flight then."""
    phases = run.select_phases(names=list(PHASES), modes=["train"],
                               columns=["process", "name", "step", "start_ns", "end_ns"])
    if not len(phases):
        return {}
    keys = pd.MultiIndex.from_arrays([steps["process"].astype(str).to_numpy(), steps["step"].to_numpy()])
    proc = phases["process"].astype(str).to_numpy()
    mask = pd.MultiIndex.from_arrays([proc, phases["step"].to_numpy()]).isin(keys)  # the summary's steps only
    phases = phases[mask]
    proc = proc[mask]
    by = {}
    for p, c in colls.groupby("process", sort=False):
        rows = proc == p
        if not rows.any():
            continue
        w = blocked[blocked["process"].to_numpy() == p]
        hidden = comm.intersect(comm.union(c["start_ns"].to_numpy(), c["end_ns"].to_numpy()),
                                comm.union(w["start_ns"].to_numpy(), w["end_ns"].to_numpy()))
        ph = phases[rows]
        # each instant once, in its innermost phase: with an optimizer closure (Lightning's,
        # LBFGS) Backward runs inside Optimizer, and its waits are Backward's only
        seg_s, seg_e, idx = decoding.innermost_segments(ph["start_ns"].to_numpy(np.int64),
                                                        ph["end_ns"].to_numpy(np.int64))
        ph = pd.DataFrame({"name": ph["name"].astype(str).to_numpy()[idx], "start_ns": seg_s, "end_ns": seg_e})
        exposed = comm.measure(hidden, ph["start_ns"].to_numpy(), ph["end_ns"].to_numpy())
        for name, ns in pd.Series(exposed).groupby(ph["name"].astype(str).to_numpy()).sum().items():
            entry = by.setdefault(name, {"exposed_ns": 0, "kinds": {}})
            entry["exposed_ns"] += int(ns)
        for kind, k in c.groupby("kind", sort=False):
            kh = comm.intersect(comm.union(k["start_ns"].to_numpy(), k["end_ns"].to_numpy()), hidden)
            inside = comm.measure(kh, ph["start_ns"].to_numpy(), ph["end_ns"].to_numpy())
            for name, ns in pd.Series(inside).groupby(ph["name"].astype(str).to_numpy()).sum().items():
                kinds = by.setdefault(name, {"exposed_ns": 0, "kinds": {}})["kinds"]
                kinds[kind] = kinds.get(kind, 0) + int(ns)
    out = {}
    for name in PHASES:
        e = by.get(name)
        if not e or e["exposed_ns"] <= 0:
            continue
        kind = max(e["kinds"], key=e["kinds"].get) if e["kinds"] else None
        out[name] = {"exposed_ms": _ms(e["exposed_ns"]), "share": round(e["exposed_ns"] / total, 4), "kind": kind}
    return out


def format_lines(c: dict, phase_shares: dict) -> list:
    """The summary's lines about communication."""
    from stepscope.analysis.quantities import percent

    kinds = ", ".join(f"{k} {v['count']}x {v['bytes'] / 1e6:.1f} MB" for k, v in c["by_kind"].items())
    lines = [f"  {'Comm':<10} {percent(c['share']):>6} of train step time with a collective in flight "
             f"({c['ms_per_step']:.2f} ms a step): exposed {percent(c['exposed_share'])}, "
             f"overlapped {percent(c['overlapped_share'])}; {kinds}"]
    if c.get("gpu"):
        g = c["gpu"]
        lines.append(f"  {'':<10} on the GPUs: NCCL kernels {percent(g['share'])} of train step time, "
                     f"{percent(g['exposed_share'])} with no compute kernel running ({g['exposed_ms_per_step']:.2f} "
                     "ms a step)")
    for phase, e in c["by_phase"].items():
        whole = phase_shares.get(phase, {}).get("share")
        head = f"{phase} {percent(whole)}" if whole is not None else phase
        lines.append(f"  {'':<10} {head}: of which waiting for {e['kind'] or 'communication'} "
                     f"{percent(e['share'])} ({e['exposed_ms']:.1f} ms)")
    for w in c["waited_for"][:3]:
        lines.append(f"  {'':<10} waited for rank {w['rank']}: {w['waited_ms']:.1f} ms in all "
                     f"({w['ms_per_step']:.2f} ms a step), it arrived last at {w['last_at']} of {w['of']} collectives")
    if c.get("left_out"):
        ops = ", ".join(f"{n} {k}x" for n, k in c["left_out"]["ops"].items())
        lines.append(f"  {'':<10} not recorded: {ops}: {c['left_out']['note']}")
    return lines
