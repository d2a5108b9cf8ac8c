"""Packaging promises: a light import, the console script, README and CI agree."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, run_python


def test_import_does_not_import_frameworks(tmp_path):
    r = run_python("""
        import sys
        import stepscope, stepscope.core, stepscope.integrations, stepscope.compat.smppy
        import stepscope.integrations.keras, stepscope.integrations.keras._window, stepscope.integrations.tfdata
        heavy = [m for m in ("torch", "tensorflow", "keras", "lightning", "pytorch_lightning", "jax")
                 if m in sys.modules]
        print("HEAVY", heavy)
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout


def test_console_script_runs(tmp_path):
    beside = os.path.join(os.path.dirname(sys.executable), "stepscope")
    exe = beside if os.path.exists(beside) else shutil.which("stepscope")
    assert exe, "the stepscope console script is not installed"
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "summary" in r.stdout


def _readme_commands():
    text = open(os.path.join(REPO, "README.md")).read()
    blocks = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S)
    assert blocks, "README has no command block"
    lines = [ln.strip() for ln in blocks[0].splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return lines


def test_readme_opens_with_two_commands_and_ci_runs_the_second():
    lines = _readme_commands()
    assert len(lines) == 2, lines
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    assert lines[1] in ci.splitlines(), "the CI script must run the README's test command verbatim"
    assert "examples/" in lines[0]


def test_ci_runs_the_slow_tests_and_a_developers_run_leaves_them_out(monkeypatch):
    """CI sets CI=true (and tox passes it on): the conformance corpus runs there."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    try:
        import run_suite
    finally:
        sys.path.pop(0)
    for value, whole in (("true", True), ("1", True), ("", False), ("false", False), ("0", False)):
        monkeypatch.setenv("CI", value)
        assert run_suite.whole_suite() is whole, value
    monkeypatch.delenv("CI")
    assert not run_suite.whole_suite()
    tox = open(os.path.join(REPO, "tox.ini")).read()
    assert re.search(r"^passenv = .*\bCI\b", tox, re.M), "tox must pass CI on to the suite"


def test_a_test_that_passes_only_on_its_rerun_is_named_in_the_last_line(tmp_path):
    """Issue 56: the suite's one-at-a-time rerun must not hide a test that fails on some
    machines. A real run of run_suite.py over a test that fails once, then passes: the run
    passes and its last line names the test."""
    shutil.copy(os.path.join(REPO, "tests", "conftest.py"), tmp_path / "conftest.py")
    shutil.copy(os.path.join(REPO, "tests", "run_suite.py"), tmp_path / "run_suite.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: x\n    slow: x\n")
    (tmp_path / "test_flaky.py").write_text(
        "import os\n"
        "def test_steady():\n    assert True\n"
        "def test_fails_once():\n"
        "    marker = os.path.join(os.path.dirname(__file__), 'failed-once')\n"
        "    if not os.path.exists(marker):\n"
        "        open(marker, 'w').close()\n"
        "        raise AssertionError('fails the first time')\n")
    # (not the outer suite's worker: a nested run must not think it is an xdist worker)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RUN_SUITE"))}
    env.update(CI="", RUN_SUITE_PACE="1.05")
    r = subprocess.run([sys.executable, "run_suite.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("[run_suite] passed; 1 test(s) needed a rerun"), last
    assert last.endswith("test_flaky.py::test_fails_once"), last


def test_the_suite_prints_its_slowest_tests_and_ci_fails_past_its_budget(tmp_path):
    """Issue 74: every run ends with its wall time and slowest tests; where CI is set, a run
    whose parallel part passes the budget fails (here a budget of a millisecond), and so does
    one where more than MAX_RERUNS tests needed their rerun."""
    shutil.copy(os.path.join(REPO, "tests", "conftest.py"), tmp_path / "conftest.py")
    shutil.copy(os.path.join(REPO, "tests", "run_suite.py"), tmp_path / "run_suite.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: x\n    slow: x\n")
    (tmp_path / "test_two.py").write_text("def test_one():\n    pass\ndef test_two():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RUN_SUITE"))}
    env.update(CI="true", RUN_SUITE_BUDGET_S="0.001", RUN_SUITE_PACE="1.05")
    r = subprocess.run([sys.executable, "run_suite.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert "over its budget of 0 s" in r.stdout
    assert "2 tests took" in r.stdout and "test_two::test_one" in r.stdout, r.stdout[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith("[run_suite] FAILED"), r.stdout[-500:]
    sys.path.insert(0, os.path.join(REPO, "tests"))
    try:
        import run_suite
    finally:
        sys.path.pop(0)
    flaky = [f"t.py::test_{i}" for i in range(run_suite.MAX_RERUNS + 1)]
    assert run_suite.within_budget(0, 1.0, flaky[:-1], True) == 0
    assert run_suite.within_budget(0, 1.0, flaky, True) == 1
    assert run_suite.within_budget(0, 1.0, flaky, False) == 0  # a developer's run is not failed for it
    assert run_suite.within_budget(1, 0.0, [], True) == 1
    # the budget is the reference machine's seconds: a machine twice as slow has twice the time
    assert run_suite.in_reference_seconds(100.0, 2 * run_suite.REFERENCE_PACE_S) == pytest.approx(50.0)
    assert run_suite.in_reference_seconds(100.0, None) == 100.0
