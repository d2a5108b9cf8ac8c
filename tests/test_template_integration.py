"""integrations/_template/ is a working integration: copied as it is into a package of its
own, over a made-up framework, and registered through a real entry point, it records the
steps and phases of a script run under zero-edit start (STEPSCOPE=1). No framework needed."""

import os
import shutil
import textwrap

import stepscope
from conftest import REPO, run_python

STEPS, FETCH_S, FORWARD_S, OPTIMIZER_S = 5, 0.005, 0.02, 0.01

# The made-up framework the template instruments (its module docstring says its shape).
MYFRAMEWORK = """
import time

__version__ = "1.2"


class DataLoader:
    def __init__(self, data, fetch_s):
        self.data, self.fetch_s = list(data), fetch_s

    def __iter__(self):
        self._left = iter(self.data)
        return self

    def __next__(self):
        time.sleep(self.fetch_s)
        return next(self._left)


class Model:
    training = True

    def __init__(self, work_s):
        self.work_s = work_s

    def __call__(self, batch):
        time.sleep(self.work_s)
        return batch


class Optimizer:
    def __init__(self, work_s):
        self.work_s = work_s

    def step(self):
        time.sleep(self.work_s)
"""

SCRIPT = f"""
import time

import myframework

model, optimizer = myframework.Model({FORWARD_S}), myframework.Optimizer({OPTIMIZER_S})
t0 = time.perf_counter()
for batch in myframework.DataLoader(range({STEPS}), {FETCH_S}):
    model(batch)
    optimizer.step()
print("loop_s", time.perf_counter() - t0)
"""


def _install_toy_integration(site):
    """The fake framework, the template copied as a package, and its dist-info (as pip leaves it)."""
    (site / "myframework.py").write_text(MYFRAMEWORK)
    shutil.copytree(os.path.join(REPO, "integrations", "_template"), site / "toy_integration",
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "toy_integration-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-integration\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[stepscope.instrumentors]\nmyframework = toy_integration:instrumentor\n")


def test_the_template_records_a_toy_frameworks_steps_under_zero_edit_start(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _install_toy_integration(site)
    runs = tmp_path / "runs"
    r = run_python(textwrap.dedent(SCRIPT), cwd=tmp_path, env={
        "STEPSCOPE": "1", "STEPSCOPE_DIR": str(runs), "STEPSCOPE_RUN": "toy", "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr
    assert "stepscope:" not in r.stderr, r.stderr  # no failure, no unsupported version
    loop_ns = float(r.stdout.split("loop_s")[1]) * 1e9

    run = stepscope.load(runs / "toy")
    steps = run.steps.sort_values("start_ns")
    assert steps["mode"].astype(str).tolist() == ["train"] * STEPS
    # each step: its fetch, its forward, its optimizer step, as long as the script slept in them
    assert (steps["GetNext"] >= FETCH_S * 1e9).all()
    assert (steps["Forward"] >= FORWARD_S * 1e9).all()
    assert (steps["Optimizer"] >= OPTIMIZER_S * 1e9).all()
    phases = steps["GetNext"] + steps["Forward"] + steps["Optimizer"]
    assert (steps["duration_ns"] >= phases).all()
    # steps are contiguous (one ends where the next one's fetch begins) and lie inside the loop
    starts, ends = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    assert (starts[1:] == ends[:-1]).all()
    assert ends[-1] - starts[0] <= loop_ns
