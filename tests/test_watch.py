"""`stepscope watch` on a real profiled torch job while it runs: the finding appears, the
--exec action gets it as JSON and stops the job (Debugger's StopTraining), watch ends
with the run."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

JOB = textwrap.dedent("""
    import os, time
    import torch
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    for i in range(2000):  # about a minute unless the watcher stops it
        if os.path.exists("stop"):
            break
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        time.sleep(0.005)
        if i % 15 == 7:
            time.sleep(0.25)  # a periodic stall: StepOutlier
    with open("steps_done", "w") as f:
        f.write(str(i))
""")


@pytest.mark.slow
def test_watch_finds_the_stall_and_stops_the_job(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_INTERVAL_MS="50")
    job = subprocess.Popen([sys.executable, "-m", "stepscope", "run", "--name", "live", "--",
                            sys.executable, "job.py"], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        watch = subprocess.run([sys.executable, "-m", "stepscope", "watch", "live", "--every", "1s", "--json",
                                "--param", "StepOutlier.min_excess_s=0.1",
                                "--exec", "cat > finding.json; touch stop", "--timeout", "150"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
        assert job.wait(timeout=60) == 0, job.stderr.read()[-2000:]
    finally:
        if job.poll() is None:
            job.kill()
    assert watch.returncode == 0, watch.stderr
    assert "the run ended" in watch.stderr
    printed = [json.loads(line) for line in watch.stdout.splitlines() if line.strip()]
    assert "StepOutlier" in {f["rule"] for f in printed}
    finding = json.loads((tmp_path / "finding.json").read_text())  # what --exec read on stdin
    assert finding["rule"] == printed[0]["rule"] and finding["message"]
    # the action stopped training early: found while the job ran, not after it
    assert int((tmp_path / "steps_done").read_text()) < 1999
