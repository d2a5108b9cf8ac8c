"""A collection before each update (issue 75 item 5): a PPO-style loop collects a rollout with
no-grad forwards before each update of 40 minibatch steps. The collection is named, with its
steps and share, and the steps that hold it are no StepOutliers; a loop whose every step has
several forwards, each with its backward (gradient accumulation), gets no such note."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from stepscope.analysis.report.summary import summarize

PPO = """
import torch, torch.nn as nn
torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4))
opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
def env_step(obs):  # the simulator, on the host
    x = 0
    for _ in range(20000):
        x += 1
    return torch.randn(8), float(x % 3)
for update in range(6):
    obs_buf, act_buf, ret_buf = [], [], []
    obs = torch.randn(8)
    with torch.no_grad():
        for t in range(128):  # the rollout
            a = torch.distributions.Categorical(logits=policy(obs)).sample()
            obs_buf.append(obs); act_buf.append(a)
            obs, r = env_step(obs)
            ret_buf.append(r)
    obs_t, act_t, ret_t = torch.stack(obs_buf), torch.stack(act_buf), torch.tensor(ret_buf)
    for mb in range(40):  # the update: 40 minibatch steps
        idx = torch.randint(0, 128, (32,))
        logp = torch.distributions.Categorical(logits=policy(obs_t[idx])).log_prob(act_t[idx])
        loss = -(logp * ret_t[idx]).mean()
        opt.zero_grad(); loss.backward(); opt.step()
print("done")
"""

ACCUMULATE = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    opt.zero_grad()
    for micro in range(8):  # eight micro-batches, each with its backward
        nn.functional.mse_loss(model(torch.randn(4, 16)), torch.randn(4, 1)).backward()
    opt.step()
print("done")
"""


def _run(tmp_path, code, name):
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN=name)
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-3000:]
    return summarize(str(tmp_path / "runs" / name))


def test_a_rollout_before_each_update_is_named_not_an_outlier(tmp_path):
    s = _run(tmp_path, PPO, "ppo")
    assert s["steps"]["train"]["count"] == 240
    (note,) = [n for n in s["loop_notes"] if n["key"] == "collection_between_updates"]
    (p,) = note["evidence"]["processes"]
    assert p["rank"] is None  # (a plain value: the summary's JSON holds it)
    json.dumps(s)
    assert p["steps"] == [0, 40, 80, 120, 160, 200]  # each update's first step holds its rollout
    assert 128 <= p["forwards_median"] <= 130  # the rollout's 128 and the update's own
    # the collection's share: most of the train steps' time is the simulator's (a control, not a time bound)
    assert p["share"] > 0.3 and "every 40 steps" in note["message"]
    assert "StepOutlier" not in {f["rule"] for f in s["findings"]}, s["findings"]


def test_gradient_accumulation_is_no_collection(tmp_path):
    s = _run(tmp_path, ACCUMULATE, "accumulate")
    assert s["steps"]["train"]["count"] == 40
    assert not [n for n in s["loop_notes"] if n["key"] == "collection_between_updates"], s["loop_notes"]
