"""SageMaker Debugger's own ``PandasFrameAnalysis`` (smdebug's source, unmodified) runs every
method on stepscope's frames, over a run with every kind of row stepscope writes: a loader's
end of data after each epoch, the intervals between loops, an interrupted step, a second
loop's mark, compile spans and operator windows (issue 73).

smdebug itself cannot be installed beside TensorFlow (it pins protobuf <= 3.20), and its
code is not ours to copy: its ``pandas_data_analysis.py`` is read from an installed smdebug
or from its wheel on PyPI (downloaded once into pytest's cache), and run with a stand-in
for the one smdebug module it imports (a logger). Without it the test skips, except where
CI is set: there it fails."""

import glob
import logging
import os
import subprocess
import sys
import types
import zipfile

import numpy as np
import pytest

from stepscope.compat.smdebug import PandasFrame

from conftest import run_python

SMDEBUG = "smdebug==1.0.34"
SOURCE = "smdebug/profiler/analysis/utils/pandas_data_analysis.py"

JOB = """
    import time, torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def train(net, opt, epochs, bad=None):
        done = 0
        for epoch in range(epochs):
            for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
                opt.zero_grad()
                if i == bad:
                    raise ValueError("bad batch")  # leaves its loop mid-iteration: an interrupted step
                torch.nn.functional.mse_loss(net(x), y).backward()
                opt.step()
                done += 1
        return done

    first = train(model, torch.optim.SGD(model.parameters(), lr=0.01), 2)
    model.eval()
    with torch.no_grad():
        for x, _ in DataLoader(data, batch_size=16):
            model(x)
    model.train()
    compiled = torch.compile(model, backend="eager")  # dynamo's compile spans, no C++ build
    try:  # a second optimizer: a second loop, after a loop mark
        train(compiled, torch.optim.Adam(model.parameters(), lr=0.001), 1, bad=5)
    except ValueError:
        pass
    time.sleep(0.3)
    print("optimizer steps", first, 5)
"""


def _smdebug_source(cache_dir) -> str:
    try:
        import smdebug.profiler.analysis.utils.pandas_data_analysis as installed
        with open(installed.__file__) as f:
            return f.read()
    except Exception:  # noqa: BLE001 - not installed (the usual case): its wheel instead
        pass
    os.makedirs(cache_dir, exist_ok=True)
    wheels = glob.glob(os.path.join(cache_dir, "smdebug-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMDEBUG, "-d", cache_dir],
                       check=True, capture_output=True, timeout=240)
        wheels = glob.glob(os.path.join(cache_dir, "smdebug-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        return z.read(SOURCE).decode()


@pytest.fixture(scope="module")
def smdebug_analysis(request):
    """smdebug's pandas_data_analysis module, its own code, with a stand-in logger module."""
    try:
        source = _smdebug_source(str(request.config.cache.mkdir("smdebug")))
    except Exception as e:  # noqa: BLE001 - no network, no index: say so
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(f"smdebug's source could not be had ({SMDEBUG}): {e}")
        pytest.skip(f"smdebug's source could not be had ({SMDEBUG}): {e}")
    logger = types.ModuleType("smdebug.core.logger")
    logger.get_logger = lambda *_: logging.getLogger("smdebug")
    saved = {name: sys.modules.get(name) for name in ("smdebug", "smdebug.core", "smdebug.core.logger")}
    sys.modules.setdefault("smdebug", types.ModuleType("smdebug"))
    sys.modules.setdefault("smdebug.core", types.ModuleType("smdebug.core"))
    sys.modules["smdebug.core.logger"] = sys.modules.get("smdebug.core.logger") or logger
    module = types.ModuleType("smdebug_pandas_data_analysis")
    try:
        exec(compile(source, SOURCE, "exec"), module.__dict__)
    finally:
        for name, was in saved.items():
            if was is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = was
    return module


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("smdebug_own")
    r = run_python(JOB, cwd=tmp, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp / "runs"),
                                      "STEPSCOPE_RUN": "every", "STEPSCOPE_INTERVAL_MS": "50"}, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "optimizer steps 16 5" in r.stdout
    pf = PandasFrame(str(tmp / "runs" / "every"))
    return pf, pf.get_all_system_metrics(), pf.get_all_framework_metrics()


def test_the_run_has_every_kind_of_row(frames):
    pf, _, fw = frames
    metric, process = fw["framework_metric"].astype(str), fw["process"].astype(str)
    assert (metric == "end of data").sum() >= 3  # two train epochs' and the eval loop's
    assert metric.str.startswith("torch.compile").any()
    assert (process == "cpu_functions").any()  # an operator window
    assert (metric == "Step:ModeKeys.TRAIN").sum() == 16 + 5
    assert (metric == "Step:ModeKeys.GLOBAL").sum() == 1  # the interrupted step
    assert (metric == "Step:ModeKeys.EVAL").sum() == 4
    assert pf.run.steps["loop"].nunique() >= 2  # a second optimizer began a second loop
    # every row has a step Debugger's code can place: none at -1
    assert (fw["step"] >= 0).all()


def test_rows_outside_steps_carry_the_step_in_effect(frames):
    """A row between steps carries the step it follows (Debugger's step counter); one before
    its process's first step, that step's number."""
    _, _, fw = frames
    steps = fw[fw["framework_metric"].astype(str).str.startswith("Step:ModeKeys")].sort_values("start_time_us")
    starts, numbers = steps["start_time_us"].to_numpy(), steps["step"].to_numpy()
    ends = steps["end_time_us"].to_numpy()
    end_of_data = fw[fw["framework_metric"] == "end of data"]
    after = 0
    for _, row in end_of_data.iterrows():
        before = np.flatnonzero(starts <= row["start_time_us"])
        assert len(before), row
        assert row["step"] == numbers[before[-1]]
        # (an operator window closing at a loop's end keeps its cost inside its last step)
        after += row["start_time_us"] >= ends[before[-1]] - 1
    assert after >= 2  # the second epoch's and the eval loop's: after their last step, in none
    first = steps["start_time_us"].min()
    early = fw[fw["start_time_us"] < first]
    assert (early["step"] == numbers[0]).all()


def test_debuggers_own_analysis_runs_every_method(frames, smdebug_analysis):
    _, sys_df, fw = frames
    mod = smdebug_analysis
    a = mod.PandasFrameAnalysis(sys_df.copy(), fw.copy())
    train = fw[fw["framework_metric"] == "Step:ModeKeys.TRAIN"]

    stats = a.get_job_statistics()
    assert stats["training_loop_start"] == train.sort_values("start_time_us")["start_time"].iloc[0]
    assert stats["job_duration"] == sys_df["timestamp_us"].max() - sys_df["timestamp_us"].min()

    by_phase = a.get_step_statistics(by=mod.StatsBy.TRAINING_PHASE).set_index("training_phase")
    durations = train["end_time_us"] - train["start_time_us"]
    # Debugger groups a kind's rows by step number: train steps 0..20 are 21 distinct steps
    assert by_phase.loc["Step:ModeKeys.TRAIN", "duration_max_us"] == durations.max()
    for by in (mod.StatsBy.FRAMEWORK_METRICS, mod.StatsBy.PROCESS):
        s = a.get_step_statistics(by=by).set_index(by.value)
        assert {"Forward", "Backward", "GetNext"} <= set(s.index)

    util = a.get_utilization_stats()
    assert "cpu" in set(util["Resource"])
    present = [r for r in mod.Resource if (sys_df["type"] == r.value).any()]
    assert mod.Resource.CPU in present
    for resource in present:
        per = a.get_utilization_stats(resource=resource, by=mod.StatsBy.TRAINING_PHASE)
        assert "Before Step:ModeKeys.TRAIN" in set(per["Training_phase"])
        assert set(per["Training_phase"]) <= {f"{where}Step:ModeKeys.{kind}" for kind in ("TRAIN", "EVAL", "GLOBAL")
                                              for where in ("", "Before ", "After ")} | {
            f"Between Step:ModeKeys.{before} and Step:ModeKeys.{after}" for before in ("TRAIN", "EVAL", "GLOBAL")
            for after in ("TRAIN", "EVAL", "GLOBAL")}
    a.get_utilization_stats(resource=[mod.Resource.CPU], by=mod.StatsBy.TRAINING_PHASE,
                            phase=["Step:ModeKeys.TRAIN"])

    usage = a.get_device_usage_stats()
    assert usage[usage["type"] == "cpu"].iloc[0, 2:].sum() == (sys_df["type"] == "cpu").sum()
    a.get_device_usage_stats(device=mod.Resource.CPU, utilization_ranges=[(0, 50), (50, 100)])

    iv = a.get_training_phase_intervals()
    assert iv["phase"].iloc[0] == "Before Step:ModeKeys.TRAIN" and iv["phase"].iloc[-1].startswith("After")
    assert {"Step:ModeKeys.TRAIN", "Step:ModeKeys.EVAL"} <= set(iv["phase"])
    assert len(a.get_training_phase_intervals(phase=["Step:ModeKeys.TRAIN"])) >= 1
