"""Where a run goes: always one folder inside STEPSCOPE_DIR, and a parent's run only
while that parent is recording it (docs/design.md, "Runs, processes and children")."""

import json
import os

import pytest

from conftest import run_python

STEPS = """
    import stepscope
    for i in range(5):
        stepscope.step()
        with stepscope.annotate("work"):
            sum(range(1000))
    print("RUN", stepscope.current().path if stepscope.current() else None)
"""


def _folders(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, _ in os.walk(root) for n in dirs)


@pytest.mark.parametrize("run_id", ["../../../escaped", "id-\udcff", "a/b", "/abs", "x" * 300, "line\nbreak"])
def test_launcher_id_that_is_no_folder_name_gets_a_generated_name(tmp_path, run_id):
    runs = tmp_path / "a" / "b" / "runs"
    r = run_python(STEPS, cwd=tmp_path, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(runs),
                                             "TORCHELASTIC_RUN_ID": run_id})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepscope: TORCHELASTIC_RUN_ID=") and "generated" in lines[0]
    assert len(lines[0]) < 300
    runs_inside = os.listdir(runs)
    assert len(runs_inside) == 1 and runs_inside[0].startswith("python-2")  # <script>-<YYYYmmdd-HHMMSS>
    assert r.stdout.split()[-1] == str(runs / runs_inside[0])
    # nothing anywhere else: only the runs folder's parents and the run itself
    assert [f for f in _folders(tmp_path) if not f.startswith(os.path.join("a", "b", "runs"))] == ["a", "a/b"]
    import stepscope

    assert len(stepscope.load(runs / runs_inside[0]).steps) == 5


def test_launcher_id_that_is_a_folder_name_names_the_run(tmp_path):
    r = run_python(STEPS, cwd=tmp_path, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": "runs",
                                             "TORCHELASTIC_RUN_ID": "job-7f3a"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert os.listdir(tmp_path / "runs") == ["python-job-7f3a"]


# --- STEPSCOPE_ACTIVE_RUN: joined only while the process that exported it records it ---------------------

EXPORTED = ("STEPSCOPE_ACTIVE_RUN", "STEPSCOPE_ACTIVE_OWNER", "STEPSCOPE_PARENT_PROCESS", "STEPSCOPE_RUN")

CHILD = """
    import json, os, stepscope
    s = stepscope.current()
    print(json.dumps({"run": s.run_dir if s else None, "process": s.process_dir if s else None}))
"""


def _child_result(r):
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_stale_active_run_without_stepscope_records_nothing(tmp_path):
    stale = tmp_path / "old-run"
    stale.mkdir()
    r = run_python(CHILD, cwd=tmp_path, env={"STEPSCOPE_ACTIVE_RUN": str(stale)})
    assert _child_result(r) == {"run": None, "process": None}
    assert r.stderr == ""
    assert os.listdir(stale) == []


def test_stale_active_run_under_stepscope_records_into_stepscope_dir(tmp_path):
    stale = tmp_path / "old-run"
    stale.mkdir()
    r = run_python(STEPS, cwd=tmp_path, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": "runs", "STEPSCOPE_RUN": "mine",
                                             "STEPSCOPE_ACTIVE_RUN": str(stale)})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepscope: ignoring STEPSCOPE_ACTIVE_RUN="), r.stderr
    assert os.listdir(stale) == []
    assert r.stdout.split()[-1] == str(tmp_path / "runs" / "mine")
    import stepscope

    assert len(stepscope.load(tmp_path / "runs" / "mine").steps) == 5


def test_variables_of_a_finished_run_are_stale(tmp_path):
    """A shell that kept what a profiled process exported (its process has ended)."""
    r = run_python("""
        import json, os, stepscope
        stepscope.start(dir="runs", name="earlier")
        print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("STEPSCOPE_")}))
    """, cwd=tmp_path)
    exported = _child_result(r)
    assert set(EXPORTED) <= set(exported)
    before = sorted(os.listdir(tmp_path / "runs" / "earlier"))
    r = run_python(CHILD, cwd=tmp_path, env=exported)
    assert _child_result(r) == {"run": None, "process": None} and r.stderr == ""
    # under STEPSCOPE=1 the run goes where STEPSCOPE_DIR says (STEPSCOPE_RUN, kept, still names it)
    r = run_python(CHILD, cwd=tmp_path, env={**exported, "STEPSCOPE": "1", "STEPSCOPE_DIR": "elsewhere"})
    assert _child_result(r)["run"] == str(tmp_path / "elsewhere" / "earlier")
    assert len(r.stderr.splitlines()) == 1 and "is not running" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path / "runs" / "earlier")) == before


def test_only_a_descendant_of_the_recording_process_joins(tmp_path):
    """While the recording process runs, its own child joins; a process that is not its
    descendant, given the same variables, does not; nor does a child started after the
    recording process stopped its session."""
    import subprocess
    import sys
    import textwrap

    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import json, os, subprocess, sys
        import stepscope
        def child():
            r = subprocess.run([sys.executable, "-c", {textwrap.dedent(CHILD)!r}], capture_output=True, text=True)
            return json.loads(r.stdout)
        run = stepscope.start(dir="runs", name="live")
        print(json.dumps({{k: v for k, v in os.environ.items() if k.startswith("STEPSCOPE_")}}), flush=True)
        sys.stdin.readline()  # the test runs an unrelated process meanwhile
        during = child()
        run.stop()
        print(json.dumps({{"during": during, "after_stop": child()}}), flush=True)
    """)], cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")})
    try:
        exported = json.loads(parent.stdout.readline())
        unrelated = run_python(CHILD, cwd=tmp_path, env={**exported, "STEPSCOPE": "1", "STEPSCOPE_DIR": "own"})
        parent.stdin.write("go\n")
        parent.stdin.flush()
        out = json.loads(parent.stdout.readline())
    finally:
        parent.communicate(timeout=60)
    live = str(tmp_path / "runs" / "live")
    assert out["during"]["run"] == live and out["during"]["process"].startswith(live)
    assert out["after_stop"]["run"] is None  # the session had ended (process.json has its end time)
    got = _child_result(unrelated)
    assert got["run"] is not None and got["run"].startswith(str(tmp_path / "own")), got
    assert "is not an ancestor" in unrelated.stderr and len(unrelated.stderr.splitlines()) == 1
    assert not os.path.exists(tmp_path / "runs" / "live" / os.path.basename(got["process"]))
