"""SageMaker Debugger's ``PandasFrame`` and ``PandasFrameAnalysis`` over a stepscope run (SPEC §8).

Analysis notebooks written for Debugger run with only their import changed:

    from stepscope.compat.smdebug import PandasFrame, PandasFrameAnalysis, StatsBy
    pf = PandasFrame(run_path)
    system_df, framework_df = pf.get_all_system_metrics(), pf.get_all_framework_metrics()
    analysis = PandasFrameAnalysis(system_df, framework_df)
    analysis.get_step_statistics(by=StatsBy.TRAINING_PHASE)

Columns, names and units are Debugger's (the contract is in docs/migrating.md):
``*_us`` columns are microseconds since the run started (one base for both
tables, so steps line up with samples); arguments named ``*_time_us`` are
microseconds since the epoch, as Debugger's were; ``timestamp``,
``start_time`` and ``end_time`` are UTC wall-clock strings in Debugger's
``%Y-%m-%dT%H:%M:%S:%f`` form.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from stepscope.analysis import load
from stepscope.compat._smdebug_analysis import JobStats, PandasFrameAnalysis, Resource, StatsBy
from stepscope.compat._smdebug_tables import (GETNEXT_METRIC, MODE_KEYS, WORKER_METRIC, dataloader_rows,
                                              framework_rows, system_rows)

__all__ = ["PandasFrame", "PandasFrameAnalysis", "StatsBy", "Resource", "JobStats", "MODE_KEYS", "GETNEXT_METRIC",
           "WORKER_METRIC"]

SYSTEM_COLUMNS = ["timestamp", "timestamp_us", "value", "system_metric", "dimension", "nodeID", "type"]
FRAMEWORK_COLUMNS = ["start_time", "end_time", "start_time_us", "end_time_us", "tid", "pid", "framework_metric",
                     "step", "bytes", "process", "nodeID"]
DATALOADER_COLUMNS = ["start_time", "end_time", "start_time_us", "end_time_us", "duration_us", "pid",
                      "framework_metric", "step", "worker_id", "num_workers", "pin_memory", "process", "node_id"]
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S:%f"


def iso_time(epoch_us) -> np.ndarray:
    """Epoch microseconds -> Debugger's UTC ``YYYY-MM-DDTHH:MM:SS:ffffff`` strings (vectorised)."""
    text = np.datetime_as_string(np.asarray(epoch_us, dtype=np.int64).astype("datetime64[us]"), unit="us")
    return np.char.replace(text, ".", ":").astype(object)


def _exact(frame: pd.DataFrame, columns, names: Iterable[str]) -> pd.DataFrame:
    """Debugger's selection: rows whose value in one of ``columns`` is one of ``names``."""
    names = list(names or [])
    if not names:
        return frame
    keep = np.zeros(len(frame), dtype=bool)
    for c in columns:
        keep |= frame[c].isin(names).to_numpy()
    return frame[keep]


def _search(frame: pd.DataFrame, columns, patterns: Iterable[str]) -> pd.DataFrame:
    """The dataloader selection: a regular expression found anywhere in one of ``columns``."""
    patterns = list(patterns or [])
    if not patterns:
        return frame
    rx = "|".join(f"(?:{p})" for p in patterns)
    keep = np.zeros(len(frame), dtype=bool)
    for c in columns:
        keep |= frame[c].astype(str).str.contains(rx, regex=True).to_numpy()
    return frame[keep]


class PandasFrame:
    """``PandasFrame(run)``: a run folder or a run name under STEPSCOPE_DIR.

    ``scan_interval`` (microseconds) and ``use_in_memory_cache`` are accepted for
    Debugger's signature; the run is read from local files and its tables are
    built once per frame, on first use.
    """

    def __init__(self, path, use_in_memory_cache=False, scan_interval=5000000000):
        self.path = str(path)
        self.step_time_mapping = dict()
        self.interval = scan_interval
        self.system_metrics, self.framework_metrics = [], []  # what cache_metrics=True accumulates
        self.run = load(path, quiet=True)
        start = self.run.info.get("start_time")
        if start is not None:
            self.start_time = int(round(float(start) * 1e6))  # epoch us: Debugger's attribute
        else:
            ev = self.run.events
            self.start_time = int(ev["start_ns"].min()) // 1000 if len(ev) else 0
        self._tables: dict = {}

    # --- helpers Debugger also has ---------------------------------------------------
    def convert_datetime_to_timestamp(self, timestamp):
        """A ``%Y-%m-%dT%H:%M:%S:%f`` string (or a datetime) -> microseconds since the epoch."""
        if isinstance(timestamp, (int, np.integer, float, np.floating)):
            return int(timestamp)
        if isinstance(timestamp, str):
            ts = pd.to_datetime(timestamp, format=TIME_FORMAT, utc=True)
        else:
            ts = pd.Timestamp(timestamp)
            ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
        return int(ts.value // 1000)

    def _converted(self, values) -> np.ndarray:
        return np.array([self.convert_datetime_to_timestamp(v) for v in values], dtype=np.int64)

    # --- the full tables, epoch-microsecond columns kept for filtering -----------------
    def _system(self) -> pd.DataFrame:
        if "system" not in self._tables:
            out = system_rows(self.run.system)
            out["timestamp"] = iso_time(out["epoch_us"].to_numpy())
            out["timestamp_us"] = out["epoch_us"] - self.start_time
            self._tables["system"] = out
        return self._tables["system"]

    def _framework(self) -> pd.DataFrame:
        if "framework" not in self._tables:
            out = framework_rows(self.run)
            out["start_time"] = iso_time(out["start_epoch_us"].to_numpy())
            out["end_time"] = iso_time(out["end_epoch_us"].to_numpy())
            out["start_time_us"] = out["start_epoch_us"] - self.start_time
            out["end_time_us"] = out["end_epoch_us"] - self.start_time
            self._tables["framework"] = out
        return self._tables["framework"]

    def _dataloader(self) -> pd.DataFrame:
        if "dataloader" not in self._tables:
            out = dataloader_rows(self.run, self._framework())
            out["start_time"] = iso_time(out["start_epoch_us"].to_numpy())
            out["end_time"] = iso_time(out["end_epoch_us"].to_numpy())
            out["start_time_us"] = out["start_epoch_us"] - self.start_time
            out["end_time_us"] = out["end_epoch_us"] - self.start_time
            self._tables["dataloader"] = out
        return self._tables["dataloader"]

    # --- Debugger's public methods ------------------------------------------------------
    def get_all_system_metrics(self, selected_system_metrics=()):
        """Every system sample; ``selected_system_metrics``: names such as ``cpu0``, ``gpu1``."""
        s = _exact(self._system(), ["system_metric"], selected_system_metrics)
        return s[SYSTEM_COLUMNS].reset_index(drop=True)

    def get_all_framework_metrics(self, selected_framework_metrics=()):
        """Every step, phase, annotation and GPU activity span; ``selected_framework_metrics``:
        names matched against ``framework_metric`` or ``process``."""
        f = _exact(self._framework(), ["framework_metric", "process"], selected_framework_metrics)
        return f[FRAMEWORK_COLUMNS].reset_index(drop=True)

    def get_profiler_data_by_time(self, start_time_us, end_time_us, cache_metrics=False,
                                  selected_framework_metrics=(), selected_system_metrics=(),
                                  get_framework_metrics=True, get_system_metrics=True):
        """(system, framework) frames between two times in microseconds since the epoch:
        samples taken in the interval, spans overlapping it (both ends included)."""
        start_time_us, end_time_us = int(start_time_us), int(end_time_us)
        sys_df = pd.DataFrame(columns=SYSTEM_COLUMNS)
        if get_system_metrics:
            s = self._system()
            s = s[s["epoch_us"].between(start_time_us, end_time_us)]
            sys_df = _exact(s, ["system_metric"], selected_system_metrics)[SYSTEM_COLUMNS]
            if cache_metrics:
                self.system_metrics.append(sys_df)
                sys_df = pd.concat(self.system_metrics).drop_duplicates()
        fw_df = pd.DataFrame(columns=FRAMEWORK_COLUMNS)
        if get_framework_metrics:
            f = self._framework()
            f = f[(f["end_epoch_us"] >= start_time_us) & (f["start_epoch_us"] <= end_time_us)]
            fw_df = _exact(f, ["framework_metric", "process"], selected_framework_metrics)[FRAMEWORK_COLUMNS]
            if cache_metrics:
                self.framework_metrics.append(fw_df)
                fw_df = pd.concat(self.framework_metrics).drop_duplicates()
        return sys_df.reset_index(drop=True), fw_df.reset_index(drop=True)

    def get_profiler_data_by_step(self, start_step, end_step, cache_metrics=False):
        """(system, framework) frames of steps ``start_step``..``end_step`` (both included):
        the spans of those steps, and the samples taken between their first start and last end."""
        fw = self.get_all_framework_metrics()
        fw = fw[fw["step"].between(start_step, end_step)]
        sys_df = self.get_all_system_metrics()
        if len(fw):
            sys_df = sys_df[sys_df["timestamp_us"].between(fw["start_time_us"].min(), fw["end_time_us"].max())]
        else:
            sys_df = sys_df.iloc[0:0]
        return sys_df.reset_index(drop=True), fw.reset_index(drop=True)

    def get_framework_metrics_by_timesteps(self, timestep_list=(), selected_framework_metrics=()):
        """For each timestamp (Debugger's string form), the spans in progress at it (strictly).
        Returns (time per ``process`` normalised to the largest, time per ``framework_metric``
        in microseconds, time per step kind ``Step:ModeKeys.*`` in microseconds)."""
        if len(timestep_list) == 0:
            return {}, {}, {}
        ts = np.sort(self._converted(timestep_list))
        f = _exact(self._framework(), ["framework_metric", "process"], selected_framework_metrics)
        hits = np.searchsorted(ts, f["end_epoch_us"].to_numpy(), "left") \
            - np.searchsorted(ts, f["start_epoch_us"].to_numpy(), "right")
        weight = np.maximum(hits, 0) * (f["end_epoch_us"] - f["start_epoch_us"]).to_numpy()
        f = f.assign(_w=weight)[weight > 0]
        per_process = {k: int(v) for k, v in f.groupby("process", sort=False)["_w"].sum().items()}
        detailed = f[~f["framework_metric"].str.contains("Step", regex=False)]
        detailed = {k: int(v) for k, v in detailed.groupby("framework_metric", sort=False)["_w"].sum().items()}
        training_phase = {k: v for k, v in per_process.items() if "Step" in k}
        framework = _normalised({k: v for k, v in per_process.items() if "Step" not in k})
        return framework, detailed, training_phase

    def get_framework_metrics_by_begin_and_end_timesteps(self, begin_timestep_list, end_timestep_list,
                                                         selected_framework_metrics=()):
        """Time of the (non-step) spans overlapping each interval, per ``process`` and per
        ``framework_metric``, each normalised to its largest (Debugger's 0-1 scale)."""
        if len(begin_timestep_list) == 0:
            return {}, {}
        begins = np.sort(self._converted(begin_timestep_list))
        ends = np.sort(self._converted(end_timestep_list))
        f = _exact(self._framework(), ["framework_metric", "process"], selected_framework_metrics)
        f = f[~f["framework_metric"].str.contains("Step", regex=False)]
        # intervals with begin <= span end, minus those that ended before the span began
        hits = np.searchsorted(begins, f["end_epoch_us"].to_numpy(), "right") \
            - np.searchsorted(ends, f["start_epoch_us"].to_numpy(), "left")
        weight = np.maximum(hits, 0) * (f["end_epoch_us"] - f["start_epoch_us"]).to_numpy()
        f = f.assign(_w=weight)[hits > 0]
        per_process = {k: int(v) for k, v in f.groupby("process", sort=False)["_w"].sum().items()}
        detailed = {k: int(v) for k, v in f.groupby("framework_metric", sort=False)["_w"].sum().items()}
        return _normalised(per_process), _normalised(detailed)

    def get_all_dataloader_metrics(self, selected_framework_metrics=()):
        """The data loading spans: the loop's fetches (``DataLoaderIter::GetNext``, one per
        GetNext phase), the loader worker processes (``DataLoaderWorker``) and any
        DataLoader span an integration records. Patterns are regular expressions searched in
        ``framework_metric`` or ``process``."""
        d = _search(self._dataloader(), ["framework_metric", "process"], selected_framework_metrics)
        return d[DATALOADER_COLUMNS].reset_index(drop=True)


def _normalised(values: dict) -> dict:
    top = max(values.values(), default=0)
    return {k: (v / float(top) if top else 0.0) for k, v in values.items()}

