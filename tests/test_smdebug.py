"""A SageMaker Debugger analysis notebook runs on a stepscope run with only its import changed:
every PandasFrame method, then every PandasFrameAnalysis method, on a real PyTorch job."""

import re

import numpy as np
import pandas as pd
import pytest

import stepscope
from stepscope.compat.smdebug import (DATALOADER_COLUMNS, FRAMEWORK_COLUMNS, SYSTEM_COLUMNS, PandasFrame,
                                      PandasFrameAnalysis, Resource, StatsBy, iso_time)
from stepscope.core import _native

from conftest import run_python

EPOCHS, BATCHES, EVAL_BATCHES = 2, 8, 2
TRAIN_STEPS = EPOCHS * BATCHES
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d:\d{6}$")

JOB = f"""
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):  # workers live long enough for the sampler to see them
        def __len__(self): return {BATCHES * 8}
        def __getitem__(self, i):
            time.sleep(0.012)
            return torch.randn(8), torch.randn(1)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = DataLoader(Slow(), batch_size=8, num_workers=2, persistent_workers=True)
    for epoch in range({EPOCHS}):
        model.train()
        for x, y in train:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        for x, _ in DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1)),
                               batch_size=16):
            model(x)
    time.sleep(0.3)
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("smdebug")
    r = run_python(JOB, cwd=tmp, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp / "runs"),
                                      "STEPSCOPE_RUN": "dbg", "STEPSCOPE_INTERVAL_MS": "50"})
    assert r.returncode == 0, r.stderr
    pf = PandasFrame(str(tmp / "runs" / "dbg"), scan_interval=5_000_000_000)
    return pf, pf.get_all_system_metrics(), pf.get_all_framework_metrics()


def _steps(fw, mode="TRAIN"):
    return fw[fw["framework_metric"] == f"Step:ModeKeys.{mode}"]


def test_frames_have_debuggers_columns_units_and_names(job):
    pf, sys_df, fw = job
    assert list(sys_df.columns) == SYSTEM_COLUMNS and list(fw.columns) == FRAMEWORK_COLUMNS
    for col in ("timestamp_us",):
        assert sys_df[col].dtype == np.int64
    for col in ("start_time_us", "end_time_us", "tid", "pid", "step", "bytes"):
        assert fw[col].dtype == np.int64, col
    assert sys_df["value"].dtype == np.float64
    assert sys_df["timestamp"].map(lambda t: bool(TIME.match(t))).all()
    assert fw["start_time"].map(lambda t: bool(TIME.match(t))).all()
    # the strings are the same instants as the microsecond columns (run start + offset, UTC)
    assert (fw["start_time"] == iso_time(fw["start_time_us"] + pf.start_time)).all()
    assert (sys_df["timestamp"] == iso_time(sys_df["timestamp_us"] + pf.start_time)).all()
    train = _steps(fw)
    assert len(train) == TRAIN_STEPS and sorted(train["step"]) == list(range(TRAIN_STEPS))
    assert len(_steps(fw, "EVAL")) == EVAL_BATCHES
    assert (train["process"] == "Step:ModeKeys.TRAIN").all() and (train["end_time_us"] > train["start_time_us"]).all()
    # steps follow one another: each begins where the previous one ended, but across an
    # epoch's end (the loader ran out: the loop's own time, however long the host makes it)
    t = train.sort_values("start_time_us")
    gaps = t["start_time_us"].to_numpy()[1:] - t["end_time_us"].to_numpy()[:-1]
    epoch_ends = np.arange(BATCHES - 1, TRAIN_STEPS - 1, BATCHES)
    assert (gaps >= 0).all() and (np.delete(gaps, epoch_ends) == 0).all(), gaps
    for phase in ("GetNext", "Forward", "Loss", "Backward", "Optimizer"):
        rows = fw[(fw["framework_metric"] == phase) & fw["step"].isin(train["step"])
                  & (fw["start_time_us"] < t["end_time_us"].max())]
        assert (rows["process"] == phase).all()
        per_step = rows.groupby("step").size().reindex(range(TRAIN_STEPS))
        # one GetNext a step at least (the fetch that finds a loader exhausted is after its loop)
        assert (per_step.ge(1) if phase == "GetNext" else per_step.eq(1)).all(), phase
    assert (fw["bytes"] == -1).all()  # CPU job: no copies with sizes
    cpu = sys_df[sys_df["type"] == "cpu"]
    assert set(cpu["dimension"]) == {"CPUUtilization", "I/OWaitPercentage"}
    assert cpu["system_metric"].str.fullmatch(r"cpu\d+").all() and cpu["value"].between(0, 100).all()
    assert sys_df["timestamp_us"].min() < train["start_time_us"].min()
    # Debugger's exact-name selection
    assert set(pf.get_all_system_metrics(["cpu0"])["system_metric"]) == {"cpu0"}
    assert set(pf.get_all_framework_metrics(["Forward"])["framework_metric"]) == {"Forward"}


def test_time_and_step_windows(job):
    pf, sys_df, fw = job
    train = _steps(fw).sort_values("step")
    lo, hi = train.iloc[3], train.iloc[5]
    s, f = pf.get_profiler_data_by_time(lo["start_time_us"] + pf.start_time, hi["end_time_us"] + pf.start_time)
    assert list(s.columns) == SYSTEM_COLUMNS and list(f.columns) == FRAMEWORK_COLUMNS
    assert set(_steps(f)["step"]) >= {3, 4, 5}
    assert s["timestamp_us"].between(lo["start_time_us"], hi["end_time_us"]).all()
    _, only = pf.get_profiler_data_by_time(0, 2**62, selected_framework_metrics=["Step:ModeKeys.TRAIN"],
                                           get_system_metrics=False)
    assert len(only) == TRAIN_STEPS
    s, f = pf.get_profiler_data_by_step(2, 4)
    assert f["step"].between(2, 4).all() and sorted(_steps(f)["step"]) == [2, 3, 4]
    assert s["timestamp_us"].between(f["start_time_us"].min(), f["end_time_us"].max()).all()


def test_framework_metrics_by_timesteps(job):
    pf, _, fw = job
    train = _steps(fw).sort_values("step").iloc[2:6]
    mid = (train["start_time_us"] + train["end_time_us"]) // 2 + pf.start_time
    metrics, detailed, phases = pf.get_framework_metrics_by_timesteps(list(iso_time(mid)))
    assert phases["Step:ModeKeys.TRAIN"] == (train["end_time_us"] - train["start_time_us"]).sum()
    assert max(metrics.values()) == 1.0 and not any("Step" in k for k in detailed)
    metrics, detailed = pf.get_framework_metrics_by_begin_and_end_timesteps(list(train["start_time"]),
                                                                             list(train["end_time"]))
    assert {"Forward", "Backward", "Optimizer"} <= set(detailed) and max(detailed.values()) == 1.0
    assert all(0 < v <= 1 for v in metrics.values())


def test_dataloader_metrics(job):
    pf, _, fw = job
    dl = pf.get_all_dataloader_metrics()
    assert list(dl.columns) == DATALOADER_COLUMNS
    fetches = pf.get_all_dataloader_metrics([".*DataLoaderIter::GetNext"])  # Debugger's own query
    assert len(fetches) == (fw["framework_metric"] == "GetNext").sum() >= TRAIN_STEPS
    assert (fetches["duration_us"] == fetches["end_time_us"] - fetches["start_time_us"]).all()
    workers = pf.get_all_dataloader_metrics(["DataLoaderWorker"])
    assert sorted(workers["worker_id"]) == [0, 1] and (workers["num_workers"] == 2).all()
    assert (workers["duration_us"] > 0).all() and (dl["pin_memory"] == "NA").all()


def test_analysis_methods(job):
    _, sys_df, fw = job
    a = PandasFrameAnalysis(sys_df, fw)
    stats = a.get_job_statistics()
    assert stats["job_duration"] == sys_df["timestamp_us"].max() - sys_df["timestamp_us"].min()
    assert stats["training_loop_start"] == _steps(fw).sort_values("step")["start_time"].iloc[0]
    assert stats.job_duration == stats["job_duration"]
    total = stats["initialization_%"] + stats["training_loop_%"] + stats["finalization_%"]
    assert total == pytest.approx(100.0, abs=0.01) and stats["finalization"] >= 0
    assert stats["initialization"] == _steps(fw)["start_time_us"].min() - sys_df["timestamp_us"].min()

    by_phase = a.get_step_statistics(by=StatsBy.TRAINING_PHASE)
    assert list(by_phase.columns) == ["training_phase", "duration_mean_us", "duration_min_us", "duration_max_us",
                                      "duration_p50_us", "duration_p95_us", "duration_p99_us"]
    train = by_phase.set_index("training_phase").loc["Step:ModeKeys.TRAIN"]
    durations = _steps(fw)["end_time_us"] - _steps(fw)["start_time_us"]
    assert train["duration_mean_us"] == pytest.approx(durations.mean())
    assert train["duration_max_us"] == durations.max() and train["duration_min_us"] == durations.min()
    for by in (StatsBy.FRAMEWORK_METRICS, StatsBy.PROCESS):
        s = a.get_step_statistics(by=by).set_index(by.value)
        assert {"Forward", "Backward", "GetNext"} <= set(s.index)
        assert (s["duration_min_us"] <= s["duration_p50_us"]).all()
        assert (s["duration_p50_us"] <= s["duration_max_us"]).all()
    assert a.get_step_statistics(by="process") is None

    util = a.get_utilization_stats()
    assert list(util.columns) == ["Resource", "nodeID", "utilization_mean", "utilization_min", "utilization_max",
                                  "utilization_p50", "utilization_p95", "utilization_p99"]
    cpu = util[util["Resource"] == "cpu"].iloc[0]
    assert cpu["utilization_mean"] == pytest.approx(sys_df[sys_df["type"] == "cpu"]["value"].mean())
    per_phase = a.get_utilization_stats(resource=Resource.CPU, by=StatsBy.TRAINING_PHASE)
    assert list(per_phase.columns[:3]) == ["Resource", "Training_phase", "nodeID"]
    assert {"Before Step:ModeKeys.TRAIN", "Step:ModeKeys.TRAIN"} <= set(per_phase["Training_phase"])

    usage = a.get_device_usage_stats()
    assert list(usage.columns[:2]) == ["type", "nodeID"] and set(usage.columns[2:]) == {(0, 10), (10, 90), (90, 100)}
    assert usage[usage["type"] == "cpu"].iloc[0, 2:].sum() == (sys_df["type"] == "cpu").sum()

    iv = a.get_training_phase_intervals()
    assert list(iv.columns) == ["start_time_us", "end_time_us", "phase"]
    assert iv["phase"].iloc[0] == "Before Step:ModeKeys.TRAIN" and iv["phase"].iloc[-1] == "After Step:ModeKeys.EVAL"
    assert "Step:ModeKeys.EVAL" in set(iv["phase"]) and (iv["start_time_us"].diff().dropna() > 0).all()
    assert (iv["start_time_us"].to_numpy()[1:] <= iv["end_time_us"].to_numpy()[:-1] + 1).all()  # no gaps
    train_iv = iv[iv["phase"] == "Step:ModeKeys.TRAIN"].iloc[0]
    assert train_iv["start_time_us"] == _steps(fw)["start_time_us"].min()


def test_gpu_memory_utilization_is_memory_used_percent(run_dir):
    """Debugger's (and CloudWatch's) GPUMemoryUtilization is the share of GPU memory in use,
    not NVML's memory-controller busy percentage."""
    s = stepscope.start(name="nvml", gpu="off", interval_ms=60000)
    system = _native.CATEGORIES.index("system")
    t0 = _native.now()
    for i in range(3):
        at = t0 + int(i * 1e8 * _native.clock_info()["ticks_per_ns"])
        for metric, value in (("util", 50), ("mem_util", 7), ("mem_used", 20 << 30), ("mem_total", 80 << 30)):
            _native.counter(system, _native.intern(f"gpu.{metric}|gpu0"), float(value), None, at)
    s.stop()
    gpu = PandasFrame(s.path).get_all_system_metrics(["gpu0"])
    mem = gpu[gpu["dimension"] == "GPUMemoryUtilization"]["value"]
    assert len(mem) == 3 and (mem == 25.0).all()
    assert (gpu[gpu["dimension"] == "GPUUtilization"]["value"] == 50).all()
    assert (gpu["type"] == "gpu").all()
    assert pd.api.types.is_float_dtype(gpu["value"])
