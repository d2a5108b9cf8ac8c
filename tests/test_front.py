"""The public analysis front on a loaded run (issue 60): summary, findings, report, export
and diff from ``stepscope.load`` alone, equal to what the CLI gives; the examples use it
and no analysis internals."""

import glob
import json
import os
import re
import subprocess
import sys

import pandas as pd

import stepscope

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = """
import time, stepscope
with stepscope.profile(dir="runs", name="{name}"):
    for i in range(40):
        stepscope.step()
        with stepscope.phase("GetNext"):
            time.sleep({wait})
        with stepscope.phase("Forward"):
            time.sleep(0.002)
    stepscope.end_step()
"""


def _job(tmp_path, name, wait):
    script = tmp_path / f"{name}.py"
    script.write_text(JOB.format(name=name, wait=wait))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return str(tmp_path / "runs" / name)


def test_a_loaded_run_gives_summary_findings_report_export_and_diff(tmp_path):
    slow, fast = _job(tmp_path, "slow", 0.008), _job(tmp_path, "fast", 0.0005)
    run = stepscope.load(slow, quiet=True)
    s = run.summary()
    cli = subprocess.run([sys.executable, "-m", "stepscope", "summary", slow, "--json"], capture_output=True,
                         text=True, timeout=120)
    assert s == json.loads(cli.stdout)  # the front's summary is the CLI's
    assert s["steps"]["train"]["count"] == 40 and "40 steps" in run.summary_text()
    findings = run.findings
    assert isinstance(findings, pd.DataFrame) and list(findings["rule"]) == [f["rule"] for f in s["findings"]]
    assert "GetNextBottleneck" in set(findings["rule"])  # 8 ms of a 10 ms step waits for data
    page = run.report(str(tmp_path / "r.html"))
    assert os.path.getsize(page) > 10_000 and "GetNextBottleneck" in open(page).read()
    trace = run.export("chrome", str(tmp_path / "trace"))
    assert glob.glob(os.path.join(trace, "*"))
    d = run.diff(fast)
    median = [r for r in d["rows"] if r["metric"].startswith("train") and "median" in r["metric"]]
    assert median and median[0]["change"] < 0  # the fast run's steps are shorter
    assert "median" in run.diff_text(fast)


def test_examples_use_the_public_front_only():
    for path in glob.glob(os.path.join(REPO, "examples", "*.py")):
        text = open(path).read()
        internal = re.findall(r"^\s*from stepscope\.analysis\.(?!rules\b)[\w.]+ import", text, re.M)
        assert not internal, (path, internal)  # (custom rules subclass stepscope.analysis.rules: its API)
