"""``PandasFrameAnalysis``: SageMaker Debugger's queries over the two frames of
``stepscope.compat.smdebug.PandasFrame``, written for stepscope (no smdebug needed).

The public methods, their arguments and the columns they return are Debugger's;
times are microseconds. Where Debugger's code had edge cases that raise (no train
step 0, a span outside every step, no data for a resource), these answer with
what the data allows instead. docs/migrating.md lists the differences.
"""

from __future__ import annotations

import logging
from enum import Enum

import numpy as np
import pandas as pd

_log = logging.getLogger("stepscope.compat.smdebug")
STEP_PREFIX = "Step:ModeKeys"
STAT_COLUMNS = ["duration_mean_us", "duration_min_us", "duration_max_us", "duration_p50_us", "duration_p95_us",
                "duration_p99_us"]
UTIL_COLUMNS = ["utilization_mean", "utilization_min", "utilization_max", "utilization_p50", "utilization_p95",
                "utilization_p99"]


class StatsBy(Enum):
    """How ``get_step_statistics`` / ``get_utilization_stats`` group."""
    TRAINING_PHASE = "training_phase"  # Step:ModeKeys.TRAIN / EVAL / PREDICT
    FRAMEWORK_METRICS = "framework_metric"  # step, phase, annotation or kernel name
    PROCESS = "process"  # the span's event phase (see docs/migrating.md)


class Resource(Enum):
    """The ``type`` column of the system frame."""
    CPU = "cpu"
    GPU = "gpu"
    IO = "i/o"
    NETWORK = "network"
    MEMORY = "memory"


class JobStats(dict):
    """``get_job_statistics()``'s answer: a dict that also reads as attributes and prints as a table."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __repr__(self) -> str:
        return repr(pd.DataFrame.from_dict({k: [v] for k, v in self.items()}, orient="index", columns=[""]))


def _stats(values: pd.Series) -> list:
    v = values.to_numpy(dtype=np.float64)
    return [v.mean(), v.min(), v.max(), *np.percentile(v, [50, 95, 99])]


class PandasFrameAnalysis:
    """``PandasFrameAnalysis(system_df, framework_df)`` on ``PandasFrame``'s frames."""

    def __init__(self, system_df: pd.DataFrame, framework_df: pd.DataFrame):
        self.sys_metrics_df = system_df.copy()
        fw = framework_df.copy()
        fw["duration_us"] = fw["end_time_us"] - fw["start_time_us"]
        self.framework_metrics_df = fw
        self._fill_steps()

    # --- steps -----------------------------------------------------------------------------
    def _step_rows(self) -> pd.DataFrame:
        fw = self.framework_metrics_df
        return fw[fw["framework_metric"].astype(str).str.startswith(STEP_PREFIX)]

    def _fill_steps(self) -> None:
        """Spans without a step number take the step whose time contains them (Debugger's rule;
        those outside every step keep -1). Each span also learns the kind of its step, so that
        train step 3 and eval step 3 are not taken for one step (column ``_kind``)."""
        fw = self.framework_metrics_df
        steps = self._step_rows()
        numbered = steps[steps["step"] != -1]
        self.step_time_df = numbered.groupby("step").agg(
            start_time_us=("start_time_us", "min"), end_time_us=("end_time_us", "max")).reset_index()
        kind = np.full(len(fw), "", dtype=object)
        if len(numbered):
            numbered = numbered.sort_values("start_time_us", kind="stable")
            starts, ends = numbered["start_time_us"].to_numpy(), numbered["end_time_us"].to_numpy()
            s, e = fw["start_time_us"].to_numpy(), fw["end_time_us"].to_numpy()
            at = np.searchsorted(starts, s, "right") - 1
            j = np.maximum(at, 0)
            inside = (at >= 0) & ((s < ends[j]) | (s == starts[j]))  # by start, as stepscope attributes
            kind[inside] = numbered["framework_metric"].to_numpy()[j[inside]]
            col = fw["step"].to_numpy().copy()
            fill = inside & (col == -1) & (e <= ends[j])
            col[fill] = numbered["step"].to_numpy()[j[fill]]
            fw["step"] = col
        is_step = fw["framework_metric"].astype(str).str.startswith(STEP_PREFIX).to_numpy()
        kind[is_step] = fw["framework_metric"].to_numpy()[is_step]
        self._kind = pd.Series(kind, index=fw.index)

    def get_job_statistics(self) -> JobStats:
        """Job start/end, its duration and the shares of initialization (before train step 0),
        the training loop and finalization (after the last span), in microseconds and percent."""
        sys_df, fw = self.sys_metrics_df, self.framework_metrics_df
        times = sys_df if len(sys_df) else None
        job_start = times["timestamp_us"].min() if times is not None else fw["start_time_us"].min()
        job_end = times["timestamp_us"].max() if times is not None else fw["end_time_us"].max()
        stats = JobStats()
        stats["start_time"] = times["timestamp"].min() if times is not None else fw["start_time"].min()
        stats["end_time"] = times["timestamp"].max() if times is not None else fw["end_time"].max()
        stats["job_duration"] = int(job_end - job_start)
        steps = self._step_rows()
        first = steps[(steps["step"] == 0) & steps["framework_metric"].isin(
            [f"{STEP_PREFIX}.TRAIN", f"{STEP_PREFIX}.GLOBAL"])]
        if first.empty:  # no train step 0: the loop starts with the first step of any mode
            first = steps if len(steps) else fw
        first = first.sort_values("start_time_us").iloc[:1]
        if first.empty:
            return stats
        loop_start, loop_end = int(first["start_time_us"].iloc[0]), int(fw["end_time_us"].max())
        stats["training_loop_start"] = first["start_time"].iloc[0]
        stats["training_loop_end"] = fw["end_time"].max()
        stats["training_loop_duration"] = loop_end - loop_start
        stats["initialization"] = int(loop_start - job_start)
        stats["finalization"] = int(max(job_end - loop_end, 0))
        for part, key in (("initialization", "initialization"), ("training_loop", "training_loop_duration"),
                          ("finalization", "finalization")):
            stats[f"{part}_%"] = 100.0 * stats[key] / stats["job_duration"] if stats["job_duration"] else 0.0
        return stats

    def get_step_statistics(self, by=StatsBy.TRAINING_PHASE):
        """mean/min/max/p50/p95/p99 of per-step durations (us), per step kind
        (``TRAINING_PHASE``), per ``framework_metric`` or per ``process``. A name's
        duration in a step runs from its first start to its last end in that step."""
        if not isinstance(by, StatsBy):
            _log.warning("%s should be of type StatsBy", by)
            return None
        fw = self.framework_metrics_df
        key = by.value
        if by == StatsBy.TRAINING_PHASE:
            fw, key = self._step_rows(), "framework_metric"
        fw = fw.assign(_kind=self._kind)
        # a row outside every step carries the step it follows (docs/migrating.md): no part of it
        fw = fw[(fw["step"] != -1) & (fw["_kind"] != "")]
        per_step = fw.groupby(["_kind", "step", key], sort=False).agg(s=("start_time_us", "min"),
                                                                      e=("end_time_us", "max"))
        per_step["d"] = per_step["e"] - per_step["s"]
        rows = [[name, *_stats(group["d"])] for name, group in per_step.groupby(level=2, sort=True)]
        return pd.DataFrame(rows, columns=[by.value, *STAT_COLUMNS])

    # --- system metrics ----------------------------------------------------------------------
    def get_utilization_stats(self, resource=None, by=None, phase=None):
        """mean/min/max/p50/p95/p99 of each resource's samples per node; with
        ``by=StatsBy.TRAINING_PHASE``, per training phase interval as well."""
        if by is not None and not isinstance(by, StatsBy):
            _log.warning("%s should be of type StatsBy", by)
            return None
        if resource is not None and not isinstance(resource, (list, Resource)):
            _log.warning("%s should be of type list or Resource", resource)
            return None
        if resource is None:
            resources = [Resource.CPU.value, Resource.GPU.value, Resource.MEMORY.value, Resource.IO.value,
                         Resource.NETWORK.value]
        else:
            resources = [r.value for r in ([resource] if isinstance(resource, Resource) else resource)]
        by_phase = by == StatsBy.TRAINING_PHASE
        sys_df = self.sys_metrics_df.copy()
        if by_phase:
            sys_df["phase"] = None
            intervals = self.get_training_phase_intervals(phase)
            for s, e, name in (intervals.itertuples(index=False) if intervals is not None else ()):
                sys_df.loc[sys_df["timestamp_us"].between(s, e), "phase"] = name
        rows = []
        for r in resources:
            part = sys_df[sys_df["type"].astype(str).str.contains(r, regex=False)]
            keys = ["phase", "nodeID"] if by_phase else ["nodeID"]
            part = part.dropna(subset=keys)
            for k, group in part.groupby(keys, sort=True):
                k = k if isinstance(k, tuple) else (k,)
                rows.append([r, *k, *_stats(group["value"])])
        columns = ["Resource", *(["Training_phase"] if by_phase else []), "nodeID", *UTIL_COLUMNS]
        return pd.DataFrame(rows, columns=columns)

    def get_device_usage_stats(self, device=None, utilization_ranges=None):
        """How many samples of each CPU/GPU metric fall in each utilization range
        (default >90, 10-90, <10 percent), per ``type`` and node."""
        if device is not None and not isinstance(device, (list, Resource)):
            _log.warning("%s should be of type list or Resource", device)
            return pd.DataFrame()
        resources = [Resource.CPU.value, Resource.GPU.value] if device is None else \
            [r.value for r in ([device] if isinstance(device, Resource) else device)]
        ranges = [(90, 100), (10, 90), (0, 10)] if utilization_ranges is None else utilization_ranges
        if not isinstance(ranges, list) or not ranges or any(len(r) != 2 for r in ranges):
            _log.warning("%s should be a non-empty list of (start, end) tuples", utilization_ranges)
            return pd.DataFrame()
        sys_df = self.sys_metrics_df
        sys_df = sys_df[sys_df["type"].astype(str).isin(resources)]
        value = sys_df["value"].to_numpy(dtype=np.float64)
        which = np.full(len(sys_df), -1)
        for i in range(len(ranges) - 1, -1, -1):  # a value on a boundary takes the first range listed
            lo, hi = ranges[i]
            which[(value >= lo) & (value <= hi)] = i
        sys_df = sys_df.assign(ranges=[tuple(ranges[i]) if i >= 0 else () for i in which])[which >= 0]
        if sys_df.empty:
            return sys_df
        counts = sys_df.groupby(["type", "nodeID", "ranges"]).size().unstack("ranges", fill_value=0)
        # every range asked for is a column, zero where no sample fell in it
        counts = counts.reindex(columns=sorted({tuple(r) for r in ranges}), fill_value=0).reset_index()
        counts.columns.name = "ranges"
        return counts

    def get_training_phase_intervals(self, phase=None):
        """The job cut into intervals: before the first training phase, each run of steps of one
        kind (``Step:ModeKeys.TRAIN``...), between two runs, and after the last; microseconds."""
        fw = self.framework_metrics_df
        available = list(pd.unique(fw["process"].astype(str)))
        if phase is None:
            phase = [p for p in available if STEP_PREFIX in p]
        if isinstance(phase, str):
            phase = [phase]
        if not isinstance(phase, list):
            _log.warning("%s should be a list of strings", phase)
            return None
        phase = [p for p in phase if p in available]
        if not phase:
            _log.warning("None of the phase strings matched the phases available in the framework metrics DataFrame")
            return None
        spans = fw[fw["framework_metric"].isin(phase)].sort_values("start_time_us", kind="stable")
        names = spans["framework_metric"].astype(str).to_numpy()
        run_id = np.cumsum(np.r_[True, names[1:] != names[:-1]])
        runs = spans.groupby(run_id).agg(start_time_us=("start_time_us", "min"), end_time_us=("end_time_us", "max"),
                                         phase=("framework_metric", "first"))
        rows = []
        for i, (s, e, name) in enumerate(runs.itertuples(index=False)):
            if i:
                prev_end, prev_name = rows[-1][1], rows[-1][2]
                if s - 1 >= prev_end + 1:
                    rows.append([prev_end + 1, s - 1, "Between " + " and ".join(sorted([prev_name, name]))])
            rows.append([int(s), int(e), name])
        sys_times = self.sys_metrics_df["timestamp_us"]
        first = sys_times.min() if len(sys_times) else fw["start_time_us"].min()
        last = sys_times.max() if len(sys_times) else fw["end_time_us"].max()
        runs_only = [r for r in rows if not r[2].startswith("Between ")]
        before = [int(first), runs_only[0][0] - 1, "Before " + runs_only[0][2]]
        after = [runs_only[-1][1] + 1, int(last), "After " + runs_only[-1][2]]
        return pd.DataFrame([before, *rows, after], columns=["start_time_us", "end_time_us", "phase"])
