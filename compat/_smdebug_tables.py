"""The rows of ``stepscope.compat.smdebug.PandasFrame``'s tables, from a loaded run.

Each builder returns Debugger's columns plus epoch-microsecond columns
(``epoch_us``, ``start_epoch_us``, ``end_epoch_us``) that the frame filters on and
turns into its own time columns. The mapping is documented in docs/migrating.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.tables.stepping import attribute_to_steps
from stepscope.core.vocabulary import GETNEXT, LOADER_FETCH, MODES

MODE_KEYS = {mode: f"Step:ModeKeys.{mode.upper()}" for mode in MODES}  # train -> Step:ModeKeys.TRAIN
GETNEXT_METRIC = "DataLoaderIter::GetNext"  # what Debugger's dataloader analysis searches for
WORKER_METRIC = "DataLoaderWorker"
# stepscope system metric -> (Debugger dimension, type); per-device metrics keep the device
# (cpu0, gpu1) as the metric name, node-wide ones take the dimension's name.
PER_DEVICE = {"cpu_util": ("CPUUtilization", "cpu"), "cpu_iowait": ("I/OWaitPercentage", "cpu"),
              "gpu_util": ("GPUUtilization", "gpu"),
              # Debugger's and CloudWatch's GPUMemoryUtilization is the share of GPU memory in use,
              # not NVML's memory-controller busy percentage (gpu_memory_util)
              "gpu_memory_used_percent": ("GPUMemoryUtilization", "gpu")}
NODE_SUMS = {"disk_iops": ("IOPS", "", "i/o"),
             "disk_read_bytes_per_s": ("ReadThroughputInBytesPerSecond", "", "i/o"),
             "disk_write_bytes_per_s": ("WriteThroughputInBytesPerSecond", "", "i/o"),
             "net_rx_bytes_per_s": ("ReceiveBytesPerSecond", "Platform", "network"),
             "net_tx_bytes_per_s": ("TransmitBytesPerSecond", "Platform", "network")}
# the ``process`` of spans that are not steps or phases: Debugger's event phase
CATEGORY_PROCESS = {"annotation": "annotation", "framework": "framework", "op": "cpu_functions",
                    "module": "module"}


def _epoch_us(ns) -> np.ndarray:
    return np.asarray(ns, dtype=np.int64) // 1000


def system_rows(s: pd.DataFrame) -> pd.DataFrame:
    parts = []

    def add(frame, metric, dimension, kind):
        if len(frame):
            parts.append(pd.DataFrame({
                "epoch_us": _epoch_us(frame["timestamp_ns"].to_numpy()),
                "value": frame["value"].to_numpy(dtype=np.float64),
                "system_metric": metric if isinstance(metric, str) else metric.astype(str).to_numpy(),
                "dimension": dimension, "nodeID": frame["node"].astype(str).to_numpy(), "type": kind}))

    devices = s["device"].astype(str)
    for metric, (dimension, kind) in PER_DEVICE.items():
        part = s[(s["metric"] == metric) & devices.str.fullmatch(rf"{kind}\d+")]
        add(part, part["device"], dimension, kind)
    add(s[s["metric"] == "mem_used_percent"], "MemoryUsedPercent", "", "memory")
    for metric, (name, dimension, kind) in NODE_SUMS.items():  # all disks / interfaces of a node
        part = s[s["metric"] == metric]
        add(part.groupby(["node", "timestamp_ns"], as_index=False, observed=True)["value"].sum(),
            name, dimension, kind)
    if not parts:
        return pd.DataFrame({"epoch_us": pd.Series(dtype="int64"), "value": pd.Series(dtype="float64"),
                             **{c: pd.Series(dtype=object) for c in ("system_metric", "dimension", "nodeID", "type")}})
    out = pd.concat(parts, ignore_index=True)
    return out.sort_values("epoch_us", kind="stable").reset_index(drop=True)


def _host_of(run) -> dict:
    ev = run.events
    pairs = ev[["process", "host"]].drop_duplicates()
    return dict(zip(pairs["process"].astype(str), pairs["host"].astype(str)))


def _steps_of(run, process: pd.Series, start_ns: np.ndarray) -> np.ndarray:
    """The number of the step (of the same process) each start time falls in, or -1."""
    steps = run.steps
    out = np.full(len(start_ns), -1, dtype=np.int64)
    if not len(steps) or not len(start_ns):
        return out
    labels = np.empty(len(start_ns), dtype=np.int64)
    process = process.astype(str).to_numpy()
    for name in np.unique(process):
        mine = np.flatnonzero(process == name)
        sub = np.empty(len(mine), dtype=np.int64)
        attribute_to_steps(steps, name, start_ns[mine], sub)
        labels[mine] = sub
    has = labels >= 0
    out[has] = steps["step"].to_numpy()[steps.index.get_indexer(labels[has])]
    return out


def _frame(start_ns, end_ns, tid, pid, metric, step, nbytes, process, node) -> pd.DataFrame:
    n = len(start_ns)

    def col(v, dtype):
        return np.full(n, v, dtype=dtype) if np.isscalar(v) else np.asarray(v).astype(dtype)

    return pd.DataFrame({
        "start_epoch_us": _epoch_us(start_ns), "end_epoch_us": _epoch_us(end_ns),
        "tid": col(tid, np.int64), "pid": col(pid, np.int64), "framework_metric": col(metric, object),
        "step": col(step, np.int64), "bytes": col(nbytes, np.int64), "process": col(process, object),
        "nodeID": col(node, object)})


def framework_rows(run) -> pd.DataFrame:
    ev, steps, phases = run.events, run.steps, run.phases
    host_of = _host_of(run)
    parts = []
    if len(steps):
        proc = steps["process"].astype(str)
        if "tid" in steps:
            tids = steps["tid"]
        else:  # the thread that wrote each step's mark
            marks = ev[(ev["category"] == "step") & (ev["kind"] == "instant")]
            tid_at = dict(zip(zip(marks["process"].astype(str), marks["start_ns"]), marks["tid"]))
            tids = [tid_at.get(k, -1) for k in zip(proc, steps["start_ns"])]
        names = steps["mode"].astype(str).map(MODE_KEYS).fillna("Step:ModeKeys.GLOBAL").to_numpy()
        parts.append(_frame(
            steps["start_ns"], steps["end_ns"], tids, steps["pid"], names, steps["step"], -1,
            names, proc.map(host_of).fillna("")))
    if len(phases):  # the phase names are their own event phase (StatsBy.PROCESS groups by them)
        names = phases["name"].astype(str).to_numpy()
        parts.append(_frame(phases["start_ns"], phases["end_ns"], phases["tid"], phases["pid"], names,
                            phases["step"], -1, names, phases["process"].astype(str).map(host_of).fillna("")))
    spans = ev[(ev["kind"] == "span") & ev["category"].isin(list(CATEGORY_PROCESS))]
    if len(spans):
        start = spans["start_ns"].to_numpy()
        parts.append(_frame(start, spans["end_ns"], spans["tid"], spans["pid"], spans["name"].astype(str),
                            _steps_of(run, spans["process"], start), -1,
                            spans["category"].astype(str).map(CATEGORY_PROCESS), spans["host"].astype(str)))
    parts += _gpu_parts(run, host_of)
    if not parts:
        return _frame(np.empty(0, np.int64), np.empty(0, np.int64), 0, 0, "", 0, 0, "", "")
    out = pd.concat(parts, ignore_index=True)
    out["step"] = _step_in_effect(out, steps, host_of)
    return out.sort_values("start_epoch_us", kind="stable").reset_index(drop=True)


def _step_in_effect(rows: pd.DataFrame, steps: pd.DataFrame, host_of: dict) -> np.ndarray:
    """Every row's ``step``, as Debugger's hook numbered its events: the step it falls in, else
    the step counter in effect when it began, i.e. the last step its process had begun (rows
    between steps, a loop's end of data, what follows the last step), and before a process's
    first step that step's number (Debugger's counter starts at it). A process without steps
    takes its node's, then the run's. So no row is left at -1: smdebug's own
    ``PandasFrameAnalysis`` looks every -1 up in the step whose span contains it, and raises
    where none does (docs/migrating.md)."""
    col = rows["step"].to_numpy(dtype=np.int64).copy()
    todo = np.flatnonzero(col < 0)
    if not len(todo) or not len(steps):
        return col
    begun = pd.DataFrame({"start": _epoch_us(steps["start_ns"]), "step": steps["step"].to_numpy(np.int64),
                          "pid": steps["pid"].to_numpy(np.int64),
                          "node": steps["process"].astype(str).map(host_of).fillna("").to_numpy()})
    begun = begun[begun["step"] >= 0].sort_values("start", kind="stable")
    if not len(begun):
        return col
    by_process = {key: g for key, g in begun.groupby(["node", "pid"], sort=False)}
    by_node = {key: g for key, g in begun.groupby("node", sort=False)}
    start, pid = rows["start_epoch_us"].to_numpy()[todo], rows["pid"].to_numpy()[todo]
    node = rows["nodeID"].astype(str).to_numpy()[todo]
    for key in set(zip(node, pid)):
        mine = (node == key[0]) & (pid == key[1])
        own = by_process.get(key, by_node.get(key[0], begun))
        at = np.searchsorted(own["start"].to_numpy(), start[mine], "right") - 1
        col[todo[mine]] = own["step"].to_numpy()[np.maximum(at, 0)]
    return col


def _gpu_parts(run, host_of) -> list:
    """GPU kernels and copies as Debugger had them: event phase ``gpu_functions-dev:<N>``,
    copies with their ``bytes``."""
    parts = []
    for table, name_of, nbytes in (("kernels", lambda t: t["name"].astype(str), lambda t: -1),
                                   ("memcpy", lambda t: "Memcpy" + t["kind"].astype(str), lambda t: t["bytes"]),
                                   ("memset", lambda t: pd.Series("Memset", index=t.index), lambda t: t["bytes"])):
        try:
            t = getattr(run, table)
        except Exception:  # noqa: BLE001 - a run without GPU records still has its other tables
            continue
        if not len(t):
            continue
        proc = t["process"].astype(str)
        parts.append(_frame(t["start_ns"], t["end_ns"], t["stream"], t["pid"], name_of(t).to_numpy(),
                            t["step"].fillna(-1), nbytes(t), "gpu_functions-dev:" + t["device"].astype(str),
                            proc.map(host_of).fillna("")))
    return parts


def dataloader_rows(run, framework: pd.DataFrame) -> pd.DataFrame:
    """The loop's fetches, the loader worker processes, and spans whose name contains
    ``DataLoader`` (the worker id: a ``LOADER_FETCH`` span's ``arg``)."""
    fetch = framework[framework["framework_metric"] == GETNEXT]
    parts = [pd.DataFrame({
        "start_epoch_us": fetch["start_epoch_us"], "end_epoch_us": fetch["end_epoch_us"], "pid": fetch["pid"],
        "framework_metric": GETNEXT_METRIC, "step": fetch["step"], "worker_id": -1,
        "process": GETNEXT, "node_id": fetch["nodeID"]})]
    ev = run.events
    spans = ev[(ev["kind"] == "span") & (ev["category"] != "phase")
               & ev["name"].astype(str).str.contains("DataLoader", regex=False)]
    if len(spans):
        name = spans["name"].astype(str)
        parts.append(pd.DataFrame({
            "start_epoch_us": _epoch_us(spans["start_ns"]), "end_epoch_us": _epoch_us(spans["end_ns"]),
            "pid": spans["pid"].to_numpy(np.int64), "framework_metric": name.to_numpy(),
            "step": _steps_of(run, spans["process"], spans["start_ns"].to_numpy()),
            # only the integration's fetch spans carry a worker id (torch's ranges, an op's)
            "worker_id": np.where((name == LOADER_FETCH) & (spans["arg"] >= 0), spans["arg"], -1),
            "process": name.str.split(r"[.:]", regex=True).str[0].to_numpy(), "node_id": spans["host"].astype(str)}))
    parts.append(_workers(run))
    out = pd.concat([p for p in parts if len(p)] or parts[:1], ignore_index=True)
    out["duration_us"] = out["end_epoch_us"] - out["start_epoch_us"]
    out["num_workers"] = _num_workers(out)
    out["pin_memory"] = "NA"  # not recorded
    for c in ("pid", "step", "worker_id", "start_epoch_us", "end_epoch_us", "duration_us", "num_workers"):
        out[c] = out[c].astype(np.int64)
    return out.sort_values("start_epoch_us", kind="stable").reset_index(drop=True)


def _workers(run) -> pd.DataFrame:
    """The child processes each rank's sampler saw (device ``pid<N>``: DataLoader workers),
    each from its first to its last sample; worker ids count from 0 per rank."""
    s = run.system
    kids = s[s["device"].astype(str).str.fullmatch(r"pid\d+") & (s["metric"] == "proc_rss")]
    if not len(kids):
        return pd.DataFrame(columns=["start_epoch_us", "end_epoch_us", "pid", "framework_metric", "step",
                                     "worker_id", "process", "node_id"])
    life = kids.groupby(["process", "node", "device"], observed=True)["timestamp_ns"].agg(["min", "max"]).reset_index()
    life = life.sort_values(["process", "min"], kind="stable")
    life["worker_id"] = life.groupby("process", observed=True).cumcount()
    return pd.DataFrame({
        "start_epoch_us": _epoch_us(life["min"]), "end_epoch_us": _epoch_us(life["max"]),
        "pid": life["device"].astype(str).str[3:].astype(np.int64).to_numpy(), "framework_metric": WORKER_METRIC,
        "step": -1, "worker_id": life["worker_id"].to_numpy(), "process": WORKER_METRIC,
        "node_id": life["node"].astype(str).to_numpy()})


def _num_workers(rows: pd.DataFrame) -> np.ndarray:
    """Per node, the most worker processes alive at once (-1 where none were seen)."""
    workers = rows[rows["framework_metric"] == WORKER_METRIC]
    most = {}
    for node, w in workers.groupby("node_id"):
        t = np.concatenate([w["start_epoch_us"].to_numpy(), w["end_epoch_us"].to_numpy()])
        d = np.concatenate([np.ones(len(w), np.int64), -np.ones(len(w), np.int64)])
        order = np.lexsort((-d, t))  # a start at the instant another ends overlaps it
        most[node] = int(np.cumsum(d[order]).max())
    return rows["node_id"].map(most).fillna(-1).to_numpy()
