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
