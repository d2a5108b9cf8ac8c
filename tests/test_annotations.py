"""Ranges the user's code already makes for other profilers (issue 15): torch's
record_function and the nvtx package's, recorded as annotations by an unmodified
script under STEPSCOPE=1, nested in the phases they ran in, in the timeline and
the Chrome export; torch's own per-step ranges are not."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nvtx")

import stepscope  # noqa: E402

STEPS = 12
SCRIPT = """
import time, nvtx, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0); torch.set_num_threads(1)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 4)
    def forward(self, x):
        with torch.profiler.record_function("hidden_layer"):
            h = torch.relu(self.fc1(x))
            time.sleep(0.002)
        return self.fc2(h)

@torch.autograd.profiler.record_function("my_loss")
def my_loss(out, y):
    time.sleep(0.003)
    return nn.functional.cross_entropy(out, y)

@nvtx.annotate()
def report(loss):
    time.sleep(0.001)

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(torch.randn(16 * %(steps)d, 32), torch.randint(0, 4, (16 * %(steps)d,))), batch_size=16)
with torch.profiler.record_function("training"):
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = my_loss(model(x), y)
        with nvtx.annotate("backward", color="red"):
            loss.backward()
        nvtx.push_range("step", domain="opt")
        opt.step()
        nvtx.pop_range(domain="opt")
        if i %% 4 == 3:
            report(loss)
            nvtx.mark("checkpoint")
print("trained")
""" % {"steps": STEPS}


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("annotated")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    plain = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True, text=True,
                           timeout=300)
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp / "runs"), STEPSCOPE_RUN="annotated")
    profiled = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=300)
    assert profiled.returncode == plain.returncode == 0, profiled.stderr[-3000:]
    assert profiled.stdout == plain.stdout == "trained\n"
    return stepscope.load(tmp / "runs" / "annotated", quiet=True)


def _annotations(run):
    ev = run.events
    return ev[ev["category"] == "annotation"].assign(name=lambda d: d["name"].astype(str))


def test_every_range_is_an_annotation_and_torch_own_ranges_are_not(annotated):
    counts = _annotations(annotated).groupby(["name", "kind"]).size().to_dict()
    assert counts == {("training", "span"): 1, ("hidden_layer", "span"): STEPS, ("my_loss", "span"): STEPS,
                      ("backward", "span"): STEPS, ("step", "span"): STEPS, ("report", "span"): STEPS // 4,
                      ("checkpoint", "instant"): STEPS // 4}
    assert len(annotated.steps) == STEPS


def test_ranges_nest_in_the_phases_they_ran_in(annotated):
    ann, ev = _annotations(annotated), annotated.events
    phases = ev[(ev["category"] == "phase") & (ev["kind"] == "span")].assign(name=lambda d: d["name"].astype(str))
    span_end = lambda d: d["start_ns"] + d["duration_ns"]  # noqa: E731

    def inside(name, phase):
        a = ann[ann["name"] == name].sort_values("start_ns")
        p = phases[phases["name"] == phase].sort_values("start_ns")
        return sum(bool(((p["start_ns"] <= r.start_ns) & (span_end(p) >= r.start_ns + r.duration_ns)).any())
                   for r in a.itertuples())

    def around(name, phase):
        a = ann[ann["name"] == name]
        p = phases[phases["name"] == phase]
        return sum(bool(((a["start_ns"] <= r.start_ns) & (span_end(a) >= r.start_ns + r.duration_ns)).any())
                   for r in p.itertuples())

    assert inside("hidden_layer", "Forward") == STEPS
    assert around("backward", "Backward") == STEPS
    assert around("step", "Optimizer") == STEPS
    # the sleeps inside them: each range is at least as long, and within its phase's time
    steps = annotated.steps
    hidden = ann[ann["name"] == "hidden_layer"]["duration_ns"]
    loss = ann[ann["name"] == "my_loss"]["duration_ns"]
    assert (hidden >= 2_000_000).all() and hidden.sum() <= steps["Forward"].sum()
    assert (loss >= 3_000_000).all()
    training = ann[ann["name"] == "training"].iloc[0]
    assert training["start_ns"] <= steps["start_ns"].min()
    assert training["start_ns"] + training["duration_ns"] >= (steps["start_ns"] + steps["duration_ns"]).max() - 1


def test_ranges_are_in_the_timeline_and_the_chrome_export(annotated):
    from stepscope.analysis.export.formats import export
    from stepscope.analysis.report.timeline import timeline_data

    names = set(timeline_data(annotated)["meta"]["names"])
    assert {"hidden_layer", "my_loss", "backward", "step", "training"} <= names
    folder = export(annotated, "chrome")
    (trace,) = [os.path.join(folder, f) for f in os.listdir(folder)]
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    assert sum(e.get("cat") == "user_annotation" and e["name"] == "hidden_layer" for e in events) == STEPS


def test_uninstrument_puts_record_function_back():
    from torch.autograd import profiler

    from stepscope.integrations import torch as st_torch

    # the class's own dict: read through the class, the native wrappers show the originals
    # (TorchScript compiles record_function from them)
    methods = lambda: (vars(profiler.record_function)["__enter__"], vars(profiler.record_function)["__exit__"])  # noqa: E731
    before = methods()
    was_on = st_torch.instrumentor.is_instrumented()
    st_torch.instrumentor.ensure()
    assert methods()[0] is not before[0]
    assert profiler.record_function.__enter__ is before[0]
    with profiler.record_function("x"):
        pass
    st_torch.uninstrument()
    assert methods() == before
    if was_on:
        st_torch.instrumentor.ensure()


def test_a_forked_child_closes_none_of_its_parents_ranges(tmp_path):
    """The child leaves the parent's with blocks too: the ranges open at the fork are the
    parent's alone (recorded once, in the parent's folder)."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import os, time, nvtx, torch\n"
        "with nvtx.annotate('outer'), torch.profiler.record_function('outer_rf'):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(0.01)\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('done')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="fork")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr[-2000:]
    run = stepscope.load(tmp_path / "runs" / "fork", quiet=True)
    ann = _annotations(run)
    procs = run.processes
    (parent,) = procs.loc[procs["parent"].isna(), "process"].astype(str)
    folders = [d for d in (tmp_path / "runs" / "fork").iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert len(folders) == 2  # the child has a folder of its own ...
    assert len(procs) == 1  # ... but, ended by os._exit before its first flush, it is no process of the run
    assert ann.groupby(["process", "name"], observed=True).size().to_dict() == {(parent, "outer"): 1,
                                                                              (parent, "outer_rf"): 1}
