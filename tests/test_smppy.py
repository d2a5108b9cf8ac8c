"""A SageMaker Profiler script runs with only its import changed."""

from conftest import run_python

SM_SCRIPT = """
    import sys, time
    {import_line}
    sm_prof = smppy.SMProfiler.instance()
    config = smppy.Config()
    config.profiler = {{"EnableCuda": "1"}}
    sm_prof.configure(config)
    sm_prof.start_profiling()
    for i in range(3):
        with smppy.annotate("step_" + str(i)):
            smppy.annotation_begin("forward")
            time.sleep(0.001)
            smppy.annotation_end("forward")
            smppy.annotation_begin("backward")
            smppy.annotation_begin("inner")
            smppy.annotation_end("inner")
            smppy.annotation_end("backward")
    sm_prof.stop_profiling()
    print("done")
"""


def _check(run_path):
    import stepscope

    ev = stepscope.load(run_path).events
    names = ev["name"].astype(str)
    assert {"step_0", "step_1", "step_2"} <= set(names)
    assert (names == "forward").sum() == 3 and (names == "backward").sum() == 3
    fwd = ev[names == "forward"]
    assert (fwd["duration_ns"] >= 1_000_000).all()
    back = ev[names == "backward"].reset_index(drop=True)
    inner = ev[names == "inner"].reset_index(drop=True)
    assert (back["start_ns"] <= inner["start_ns"]).all() and (inner["end_ns"] <= back["end_ns"]).all()


def test_smppy_script_with_changed_import(tmp_path):
    r = run_python(SM_SCRIPT.format(import_line="from stepscope.compat import smppy"), cwd=tmp_path,
                   env={"STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": "sm"})
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    _check(tmp_path / "runs" / "sm")


def test_smppy_script_unchanged_under_zero_edit_mode(tmp_path):
    r = run_python(SM_SCRIPT.format(import_line="import smppy"), cwd=tmp_path,
                   env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": "sm0"})
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    _check(tmp_path / "runs" / "sm0")
