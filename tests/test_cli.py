"""The command line: run, summary --json, ls; exit 2 with one line on bad input."""

import json
import subprocess
import sys

from stepscope.core.vocabulary import REPORT_FILE

TRAIN = """
import time, stepscope
for i in range(30):
    stepscope.step()
    with stepscope.phase("GetNext"):
        time.sleep(0.002)
    with stepscope.phase("Forward"):
        time.sleep(0.001)
print("trained")
"""


def _cli(*args, cwd, env=None):
    import os

    e = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "stepscope", *args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=120)


def test_run_then_summary_then_ls(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    r = _cli("run", "--dir", "runs", "--name", "cli", "--", sys.executable, "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "trained" in r.stdout
    assert "run written to" in r.stderr
    assert (tmp_path / "runs" / "cli" / REPORT_FILE).exists() and "report at" in r.stderr
    s = _cli("summary", "runs/cli", "--json", cwd=tmp_path)
    assert s.returncode == 0, s.stderr
    summary = json.loads(s.stdout)
    assert summary["run"] == "cli" and summary["ranks"] == 1
    assert summary["steps"]["train"]["count"] == 30
    assert summary["steps"]["train"]["mean_ms"] >= 3.0
    assert 0.4 < summary["phases"]["GetNext"]["share"] < 0.8
    assert summary["dropped_events"] == 0
    ls = _cli("ls", "runs", cwd=tmp_path)
    assert ls.returncode == 0 and "cli" in ls.stdout


def test_run_propagates_exit_code(tmp_path):
    r = _cli("run", "--dir", "runs", "--", sys.executable, "-c", "import sys; sys.exit(7)", cwd=tmp_path)
    assert r.returncode == 7


def test_bad_input_exits_2_with_one_line(tmp_path):
    for args in (["summary", "no-such-run"], ["run", "--interval-ms", "3", "--", "true"], ["run"]):
        r = _cli(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_example_quickstart_runs(tmp_path):
    from conftest import REPO

    r = subprocess.run([sys.executable, f"{REPO}/examples/quickstart.py", "--steps", "40", "--dir", "runs"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "40 steps" in r.stdout and "GetNext" in r.stdout
