"""A finding's saving is a prediction, and the next run checks it (issue 75): a DataLoader-starved
loop run with num_workers=0, then with 4 workers; GetNextBottleneck predicts what the workers
save, and `stepscope diff` says whether the second run shows it. The loader's cost is a sleep
per sample (the workers wait in parallel, on any number of cores), so both runs hold beside
other load."""

import json
import os
import subprocess
import sys

import pytest

JOB = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset

class Decoded(Dataset):  # 2.5 ms to read and decode a sample
    def __len__(self): return 8 * 40
    def __getitem__(self, i):
        time.sleep(0.0025)
        return torch.randn(32), torch.randn(1)

workers = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Decoded(), batch_size=8, num_workers=workers, persistent_workers=workers > 0,
                    prefetch_factor=4 if workers else None)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    time.sleep(0.008)  # the step's work on a device (4 workers make a batch every 5 ms)
print("done")
"""


def _run(tmp_path, name, workers):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN=name)
    r = subprocess.run([sys.executable, str(script), str(workers)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-3000:]
    return str(tmp_path / "runs" / name)


def _diff(tmp_path, a, b):
    r = subprocess.run([sys.executable, "-m", "stepscope", "diff", a, b, "--json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.slow
def test_the_loaders_predicted_saving_is_confirmed_by_the_run_with_workers(tmp_path):
    starved, fed = _run(tmp_path, "starved", 0), _run(tmp_path, "fed", 4)
    d = _diff(tmp_path, starved, fed)
    (p,) = [p for p in d["predictions"] if p["rule"] == "GetNextBottleneck"]
    saving = p["predicted"]
    assert saving["basis"] == "what-if" and saving["low"] <= saving["ms_per_step"] <= saving["high"]
    assert p["verdict"] == "confirmed", p
    # the measured saving within 30% of the prediction
    assert 0.7 <= p["measured_share_of_prediction"] <= 1.3, p
    assert d["step_time"]["verdict"] == "faster"
    # the same run against itself: no change, and the prediction not shown
    same = _diff(tmp_path, starved, starved)
    assert same["step_time"]["verdict"] == "no change" and same["step_time"]["shorter_ms"] == 0
    assert {p["verdict"] for p in same["predictions"]} == {"not"}
    text = subprocess.run([sys.executable, "-m", "stepscope", "diff", starved, fed], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300).stdout
    assert "prediction: GetNextBottleneck would save" in text and ": confirmed (measured" in text


def test_runs_that_did_different_work_are_not_compared(tmp_path):
    from synthetic import steps_run

    from stepscope.analysis.report.diff import diff

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = steps_run(tmp_path / "a", "a", [10.0] * 20, extra_ms=[0.0] * 20)
    b = steps_run(tmp_path / "b", "b", [8.0] * 30, extra_ms=[0.0] * 30)
    d = diff(str(a), str(b), {"StepOutlier": {"min_excess_s": 1.0}})
    assert d["step_time"]["verdict"] == "faster" and d["step_time"]["shorter_ms"] == pytest.approx(2.0, abs=0.01)
    fake = {"rule": "GetNextBottleneck", "rank": None, "saving": {"ms_per_step": 2.0}}
    from stepscope.analysis.report.diff import prediction
    from stepscope.analysis.run import load

    p = prediction(fake, load(str(a), quiet=True), load(str(b), quiet=True))
    assert p["verdict"] == "not comparable" and "different work" in p["why"]

