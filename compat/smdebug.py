"""SageMaker Debugger's ``PandasFrame`` over a stepscope run (SPEC §8).

Analysis notebooks written for Debugger run unchanged on stepscope runs:

    from stepscope.compat.smdebug import PandasFrame
    pf = PandasFrame(run_path)
    system = pf.get_all_system_metrics()
    cpu = system[system["system_metric"].str.match("cpu")]
    framework = pf.get_all_framework_metrics()
    steps = framework[framework["framework_metric"] == "Step:ModeKeys.TRAIN"]
    durations = steps["end_time_us"] - steps["start_time_us"]

Columns and names are Debugger's. Times are microseconds since the run
started (``timestamp_us``, ``start_time_us``, ``end_time_us``), the same base in
both tables so that steps line up with samples; ``timestamp`` is the wall
clock in Debugger's ``YYYY-MM-DDTHH:MM:SS:ffffff`` form.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from stepscope.analysis import load
from stepscope.core.vocabulary import MODES

SYSTEM_COLUMNS = ["timestamp", "timestamp_us", "value", "system_metric", "dimension", "nodeID", "type"]
FRAMEWORK_COLUMNS = ["start_time_us", "end_time_us", "framework_metric", "step", "pid", "tid", "process", "nodeID"]
MODE_KEYS = {mode: f"Step:ModeKeys.{mode.upper()}" for mode in MODES}  # train -> Step:ModeKeys.TRAIN


def _debugger_time(ns: np.ndarray) -> np.ndarray:
    t = pd.to_datetime(ns, unit="ns", utc=True)
    return np.asarray(t.strftime("%Y-%m-%dT%H:%M:%S:%f"))


def _select(frame: pd.DataFrame, column: str, patterns: Optional[Iterable[str]]) -> pd.DataFrame:
    patterns = list(patterns or [])
    if not patterns:
        return frame
    rx = re.compile("|".join(f"(?:{p})" for p in patterns))
    return frame[frame[column].map(lambda v: bool(rx.match(str(v))))]


class PandasFrame:
    """``PandasFrame(run)``: a run folder or a run name under STEPSCOPE_DIR."""

    def __init__(self, path, use_in_memory_cache: bool = False, scan_interval_us: int = 0):
        self.run = load(path, quiet=True)
        events = self.run.events
        start = self.run.info.get("start_time")
        if start is not None:
            self.start_ns = int(float(start) * 1e9)
        elif len(events):
            self.start_ns = int(events["start_ns"].min())
        else:
            self.start_ns = 0

    def _us(self, ns) -> np.ndarray:
        return ((np.asarray(ns, dtype=np.int64) - self.start_ns) // 1000).astype(np.int64)

    # --- system ---------------------------------------------------------------
    def get_all_system_metrics(self, selected_system_metrics=None) -> pd.DataFrame:
        s = self.run.system
        rows = []

        def add(frame, system_metric, dimension, kind):
            if frame.empty:
                return
            rows.append(pd.DataFrame({
                "timestamp_ns": frame["timestamp_ns"].to_numpy(), "value": frame["value"].to_numpy(),
                "system_metric": system_metric if isinstance(system_metric, str) else system_metric.to_numpy(),
                "dimension": dimension, "nodeID": frame["node"].to_numpy(), "type": kind}))

        cores = s[s["device"].str.fullmatch(r"cpu\d+")]
        util = cores[cores["metric"] == "cpu_util"]
        add(util, util["device"], "CPUUtilization", "cpu")
        wait = cores[cores["metric"] == "cpu_iowait"]
        add(wait, wait["device"], "I/OWaitPercentage", "cpu")
        add(s[s["metric"] == "mem_used_percent"], "MemoryUsedPercent", "", "memory")

        def node_sum(metric):  # all disks / interfaces of a node at one instant
            part = s[s["metric"] == metric]
            return part.groupby(["node", "timestamp_ns"], as_index=False)["value"].sum()

        add(node_sum("disk_iops"), "IOPS", "", "i/o")
        add(node_sum("disk_read_bytes_per_s"), "ReadThroughputInBytesPerSecond", "", "i/o")
        add(node_sum("disk_write_bytes_per_s"), "WriteThroughputInBytesPerSecond", "", "i/o")
        add(node_sum("net_rx_bytes_per_s"), "ReceiveBytesPerSecond", "Platform", "network")
        add(node_sum("net_tx_bytes_per_s"), "TransmitBytesPerSecond", "Platform", "network")
        gpus = s[s["device"].str.fullmatch(r"gpu\d+")]
        for metric, dimension in (("gpu_util", "GPUUtilization"), ("gpu_memory_util", "GPUMemoryUtilization")):
            part = gpus[gpus["metric"] == metric]
            add(part, part["device"], dimension, "gpu")
        if not rows:
            return pd.DataFrame(columns=SYSTEM_COLUMNS)
        out = pd.concat(rows, ignore_index=True).sort_values("timestamp_ns", kind="stable")
        out["timestamp"] = _debugger_time(out["timestamp_ns"].to_numpy())
        out["timestamp_us"] = self._us(out["timestamp_ns"].to_numpy())
        out = out[SYSTEM_COLUMNS].reset_index(drop=True)
        return _select(out, "system_metric", selected_system_metrics)

    # --- framework ------------------------------------------------------------
    def get_all_framework_metrics(self, selected_framework_metrics=None) -> pd.DataFrame:
        steps = self.run.steps
        events = self.run.events
        parts = []
        if len(steps):
            parts.append(pd.DataFrame({
                "start_ns": steps["start_ns"].to_numpy(), "end_ns": steps["end_ns"].to_numpy(),
                "framework_metric": steps["mode"].map(MODE_KEYS).fillna("Step:ModeKeys.GLOBAL").to_numpy(),
                "step": steps["step"].to_numpy(), "pid": steps["pid"].to_numpy(),
                "tid": -1, "process": steps["process"].astype(str).to_numpy(),
                "nodeID": self._hosts_of(steps["process"])}))
        spans = events[(events["kind"] == "span") & (events["category"] != "system")]
        if len(spans):
            parts.append(pd.DataFrame({
                "start_ns": spans["start_ns"].to_numpy(), "end_ns": spans["end_ns"].to_numpy(),
                "framework_metric": spans["name"].astype(str).to_numpy(), "step": spans["step"].to_numpy(),
                "pid": spans["pid"].to_numpy(), "tid": spans["tid"].to_numpy(),
                "process": spans["process"].astype(str).to_numpy(), "nodeID": spans["host"].astype(str).to_numpy()}))
        if not parts:
            return pd.DataFrame(columns=FRAMEWORK_COLUMNS)
        out = pd.concat(parts, ignore_index=True).sort_values("start_ns", kind="stable")
        out["start_time_us"] = self._us(out["start_ns"].to_numpy())
        out["end_time_us"] = self._us(out["end_ns"].to_numpy())
        out = out[FRAMEWORK_COLUMNS].reset_index(drop=True)
        return _select(out, "framework_metric", selected_framework_metrics)

    def _hosts_of(self, processes: pd.Series) -> np.ndarray:
        events = self.run.events
        host_of = dict(zip(events["process"].astype(str), events["host"].astype(str)))
        return np.array([host_of.get(str(p), "") for p in processes], dtype=object)
