"""A SageMaker Profiler script runs with only its import changed (or none, under STEPSCOPE=1):
its step_N annotations are the steps, its phase annotations the phases, counted once."""

import json

import pytest

import stepscope
from stepscope.analysis.report.summary import summarize

from conftest import run_python

ITERATIONS = 6
PHASES = ("Forward", "Loss", "Backward", "Optimizer")

# SageMaker Profiler's example training loop, CPU version.
TORCH_SCRIPT = """
    import torch
    {import_line}
    sm_prof = smppy.SMProfiler.instance()
    config = smppy.Config()
    config.profiler = {{"EnableCuda": "1"}}
    sm_prof.configure(config)
    sm_prof.start_profiling()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    criterion = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range({n})]
    for i, (data, target) in enumerate(batches):
        step_annotation = smppy.annotate("step_" + str(i))
        step_annotation.__enter__()
        with smppy.annotate("Forward"):
            output = model(data)
        with smppy.annotate("Loss"):
            loss = criterion(output, target)
        with smppy.annotate("Backward"):
            optimizer.zero_grad()
            loss.backward()
        with smppy.annotate("Optimizer"):
            optimizer.step()
        step_annotation.__exit__(None, None, None)
    sm_prof.stop_profiling()
    print("done")
"""

# No framework at all: only the annotations say what the loop does.
PLAIN_SCRIPT = """
    import time
    {import_line}
    sm_prof = smppy.SMProfiler.instance()
    sm_prof.start_profiling()
    for i in range({n}):
        with smppy.annotate("step_" + str(i)):
            smppy.annotation_begin("forward")
            time.sleep(0.002)
            smppy.annotation_end("forward")
            with smppy.annotate("Loss"):
                pass
            smppy.annotation_begin("backward")
            smppy.annotation_begin("inner")
            smppy.annotation_end("inner")
            smppy.annotation_end("backward")
            with smppy.annotate("optimizer"):
                time.sleep(0.001)
    sm_prof.stop_profiling()
    print("done")
"""

MODES = {"changed_import": ("from stepscope.compat import smppy", {}),
         "zero_edit": ("import smppy", {"STEPSCOPE": "1"})}


def _run(tmp_path, script, mode, n=ITERATIONS):
    import_line, env = MODES[mode]
    r = run_python(script.format(import_line=import_line, n=n), cwd=tmp_path,
                   env={**env, "STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": "sm"})
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    assert "stepscope:" not in r.stderr, r.stderr
    return stepscope.load(tmp_path / "runs" / "sm")


def _check_steps_and_phases(run, n):
    steps = run.steps
    assert list(steps["mode"]) == ["train"] * n and list(steps["step"]) == list(range(n))
    per_step = run.phases[run.phases["mode"] == "train"].groupby(["step", "name"], observed=True).size()
    for phase in PHASES:
        counts = per_step.xs(phase, level="name").reindex(range(n))
        assert counts.eq(1).all(), (phase, counts.tolist())
    s = summarize(run)
    assert s["steps"]["train"]["count"] == n
    for phase in PHASES:
        assert s["phases"][phase]["count"] == n, phase


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sagemaker_example_loop(tmp_path, mode):
    pytest.importorskip("torch")
    run = _run(tmp_path, TORCH_SCRIPT, mode)
    _check_steps_and_phases(run, ITERATIONS)
    names = set(run.events["name"].astype(str))
    assert {f"step_{i}" for i in range(ITERATIONS)} <= names  # the annotations as written


@pytest.mark.parametrize("mode", sorted(MODES))
def test_annotation_only_script(tmp_path, mode):
    run = _run(tmp_path, PLAIN_SCRIPT, mode)
    _check_steps_and_phases(run, ITERATIONS)
    ph = run.phases
    assert (ph[ph["name"] == "Forward"]["duration_ns"] >= 2_000_000).all()
    ev = run.events
    back = ev[ev["name"] == "Backward"].reset_index(drop=True)
    inner = ev[ev["name"] == "inner"].reset_index(drop=True)
    assert len(inner) == ITERATIONS
    assert (back["start_ns"] <= inner["start_ns"]).all() and (inner["end_ns"] <= back["end_ns"]).all()
    # steps are contiguous and the last one ends where its annotation ended
    st = run.steps
    assert (st["start_ns"].to_numpy()[1:] == st["end_ns"].to_numpy()[:-1]).all()
    last = ev[ev["name"] == f"step_{ITERATIONS - 1}"].iloc[0]
    assert 0 <= st["end_ns"].iloc[-1] - last["end_ns"] < 0.1 * st["duration_ns"].median()


WINDOW_SCRIPT = """
    import torch
    import smppy
    import stepscope
    sm_prof = smppy.SMProfiler.instance()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(40):
        if i == 10:
            sm_prof.start_profiling()
        with smppy.annotate("step_" + str(i)):
            with smppy.annotate("Forward"):
                loss = model(torch.randn(4, 8)).pow(2).mean()
            with smppy.annotate("Backward"):
                optimizer.zero_grad()
                loss.backward()
            with smppy.annotate("Optimizer"):
                optimizer.step()
        if i == 20:
            sm_prof.stop_profiling()
            assert stepscope.current() is not None  # the job's run goes on
    print("done")
"""


def test_profiling_window_under_zero_edit_keeps_the_whole_job(tmp_path):
    pytest.importorskip("torch")
    r = run_python(WINDOW_SCRIPT, cwd=tmp_path, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs"),
                                                     "STEPSCOPE_RUN": "win"})
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    run = stepscope.load(tmp_path / "runs" / "win")
    assert len(run.steps) == 40 and list(run.steps["step"]) == list(range(40))
    assert (run.steps[["Forward", "Backward", "Optimizer"]] > 0).all().all()  # phases outside the window too
    ev = run.events
    window = ev[ev["name"] == "smppy.profiling"]
    assert len(window) == 1
    steps = run.steps.set_index("step")
    step_20 = ev[ev["name"] == "step_20"].iloc[0]
    assert window["start_ns"].iloc[0] <= steps.loc[10, "start_ns"]
    assert step_20["end_ns"] <= window["end_ns"].iloc[0] <= steps.loc[21, "start_ns"]
    assert not run.system.empty  # system metrics for the whole job
    info = json.loads((tmp_path / "runs" / "win" / "run.json").read_text())
    assert info.get("end_time") is not None


def test_stop_profiling_ends_the_session_it_started(tmp_path):
    r = run_python("""
        import stepscope
        from stepscope.compat import smppy
        prof = smppy.SMProfiler.instance()
        prof.start_profiling()
        assert stepscope.current() is not None
        with smppy.annotate("step_0"):
            pass
        prof.stop_profiling()
        assert stepscope.current() is None
        print("done")
    """, cwd=tmp_path, env={"STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": "own"})
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    assert len(stepscope.load(tmp_path / "runs" / "own").steps) == 1
