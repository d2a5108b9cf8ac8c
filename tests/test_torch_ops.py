"""Operator windows (integrations/torch/_ops.py): real CPU training under STEPSCOPE=1,
torch's own profiler in the sampled steps, ops nested in their phases and steps."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402

TRAIN = """
import sys, time, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0); torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
lossf = nn.CrossEntropyLoss()
n = int(sys.argv[1])
data = DataLoader(TensorDataset(torch.randn(16 * n, 32), torch.randint(0, 4, (16 * n,))), batch_size=16)
t0 = time.monotonic_ns()
for x, y in data:
    opt.zero_grad(); loss = lossf(model(x), y); loss.backward(); opt.step()
print("LOOP", t0, time.monotonic_ns())
"""

FORWARD_OPS = {"aten::linear", "aten::addmm", "aten::relu"}
BACKWARD_OPS = {"aten::mm", "autograd::engine::evaluate_function: AddmmBackward0"}
OPTIMIZER_OPS = {"aten::add_", "aten::mul_", "aten::sqrt"}  # Adam's update
LOSS_OPS = {"aten::cross_entropy_loss", "aten::nll_loss"}


def profiled(tmp_path, source, *args, name="run", **env_extra):
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update({"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": name}, **env_extra)
    r = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, stepscope.load(tmp_path / "runs" / name)


def sampled_steps(ops):
    return sorted(set(ops["step"].tolist()))


def test_ops_in_sampled_steps_nest_in_their_phases(tmp_path):
    r, run = profiled(tmp_path, TRAIN, 40)
    assert "stepscope:" not in r.stderr and "USDT" not in r.stderr, r.stderr[-2000:]  # Kineto's logs dropped
    ops, phases, steps = run.ops, run.phases, run.steps
    assert len(steps) == 40
    assert sampled_steps(ops) == [5, 6, 7]  # the early window; 40 short steps leave no budget for another
    assert set(ops["mode"]) == {"train"}
    names = set(ops["name"])
    assert FORWARD_OPS | BACKWARD_OPS | OPTIMIZER_OPS | LOSS_OPS <= names
    # known operators fall in their phase, and inside that phase's span
    for phase, known in (("Forward", FORWARD_OPS), ("Backward", BACKWARD_OPS), ("Optimizer", OPTIMIZER_OPS),
                         ("Loss", LOSS_OPS)):
        mine = ops[ops["name"].isin(known)]
        assert (mine["phase"] == phase).all(), mine.groupby(["name", "phase"]).size()
        spans = phases[phases["name"] == phase]
        for o in mine.itertuples():
            inside = spans[(spans["start_ns"] <= o.start_ns) & (spans["end_ns"] >= o.end_ns)]
            assert len(inside) == 1 and int(inside["step"].iloc[0]) == o.step, (o.name, o.step)
    # the Optimizer phase, begun at the entry of the optimizer step's own range (the op torch
    # records around its hooks) and ended after its exit, encloses that op: spans nest
    for o in ops[ops["name"] == "Optimizer.step#SGD.step"].itertuples():
        spans = phases[(phases["name"] == "Optimizer") & (phases["step"] == o.step)]
        assert len(spans) == 1 and spans["start_ns"].iloc[0] <= o.start_ns <= o.end_ns <= spans["end_ns"].iloc[0]
    # every sampled step runs the same ops in each phase (GetNext and Other: the first step's
    # fetch and zero_grad came before its window opened, where the step was recognised)
    per_step = ops[~ops["phase"].isin(["GetNext", "Other"])].groupby(["phase", "step"]).size().unstack()
    assert (per_step.nunique(axis=1) == 1).all(), per_step
    assert per_step.loc["Forward"].iloc[0] == 22  # 2 x (linear, t, transpose, as_strided, addmm, ...) + relu
    # self time: torch's definition (minus nested ops); never above the op's own time
    assert (ops["self_ns"] <= ops["duration_ns"]).all() and (ops["self_ns"] >= 0).all()
    for step, o in ops.groupby("step"):
        assert o["self_ns"].sum() <= int(steps.loc[steps["step"] == step, "duration_ns"].iloc[0])
    # input dims and sequence numbers: backward ops link to their forward
    addmm = ops[ops["name"] == "aten::addmm"]
    assert set(addmm["shapes"]) == {"[[64], [16, 32], [32, 64], [], []]", "[[4], [16, 64], [64, 4], [], []]"}
    for step, o in ops.groupby("step"):
        forward = set(o.loc[o["name"] == "aten::addmm", "sequence_nr"])
        backward = set(o.loc[o["name"] == "autograd::engine::evaluate_function: AddmmBackward0", "sequence_nr"])
        assert len(forward) == 2 and forward == backward, (step, forward, backward)
    # the aggregate: per phase and operator
    summary = run.op_summary()
    fwd = summary[summary["phase"] == "Forward"].set_index("name")
    assert fwd.loc["aten::addmm", "count"] == 6 and (fwd["steps"] == 3).all()
    assert fwd.loc["aten::addmm", "self_ns"] == addmm["self_ns"].sum()
    assert 0 < fwd["share"].sum() <= 1.0
    assert (summary.groupby("phase")["share"].sum() <= 1.0 + 1e-9).all()
    top = run.op_summary(top=3)
    assert top.groupby("phase").size().max() <= 3


MANY_OPS = """
import torch, torch.nn as nn
torch.manual_seed(0); torch.set_num_threads(1)
cell, head = nn.GRUCell(8, 16), nn.Linear(16, 4)  # a decoder run token by token: many small ops a step
opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.05)
lossf = nn.CrossEntropyLoss()
x, y = torch.randn(24, 1, 8), torch.randint(0, 4, (24, 1))
for step in range(16):
    opt.zero_grad()
    h, loss = torch.zeros(1, 16), 0
    for t in range(24):
        h = cell(x[t], h)
        loss = loss + lossf(head(h), y[t])
    loss.backward()
    opt.step()
"""


def test_opening_and_closing_a_window_are_not_the_time_of_the_phases_they_fall_in(tmp_path):
    """Opening the first window (torch's profiler started: ~1-2 ms here) falls
    in the phase that began step 5, its first step; closing it (every op of steps 5-7 read
    and written: tens to hundreds of ms for steps of many small ops) in the next step's
    first phase. Both are stepscope's cost, counted in Other, and the summary says how
    much; a step they touch is no StepOutlier."""
    from stepscope.analysis.report.summary import summarize

    _, run = profiled(tmp_path, MANY_OPS)
    steps, phases = run.steps, run.phases
    assert len(steps) == 16
    spans = run.select(categories=["framework"], names=["stepscope.op_window_open", "stepscope.op_window"],
                       columns=["name", "tid", "start_ns", "end_ns"]).sort_values("start_ns")
    assert spans["name"].tolist() == ["stepscope.op_window_open", "stepscope.op_window"]
    total = 0
    for window in spans.itertuples():
        cost = window.end_ns - window.start_ns
        total += cost
        around = phases[(phases["tid"] == window.tid) & (phases["start_ns"] <= window.start_ns)
                        & (phases["end_ns"] >= window.end_ns)]
        assert len(around), f"{window.name} inside a phase (a zero_grad or forward)"
        inner = around.sort_values("start_ns").iloc[-1]
        assert inner["exclusive_ns"] <= inner["end_ns"] - inner["start_ns"] - cost, inner
        step = steps[steps["step"] == inner["step"]].iloc[0]
        assert step["step"] == (5 if window.name.endswith("open") else 8)
        assert step["Other"] >= cost
        if window.name == "stepscope.op_window":  # (opening: ~1 ms here, within a phase's spread)
            # the phase it fell in keeps its usual size: no step's phase is the window's cost
            assert steps[inner["name"]].max() < cost
    parts = steps[["GetNext", "Forward", "Loss", "Backward", "Optimizer", "Other"]].sum(axis=1)
    assert (parts == steps["duration_ns"]).all()  # steps still add up
    s = summarize(run)
    w = s["profiler_windows"]
    assert w["windows"] == 1 and abs(w["total_ms"] - total / 1e6) < 1e-3
    assert abs(w["share"] - total / steps["duration_ns"].sum()) < 1e-4
    assert w["share"] >= 0.02 and any("operator windows took" in n for n in s["notes"]), s["notes"]
    assert "StepOutlier" not in {f["rule"] for f in s["findings"]}, s["findings"]
    from stepscope.analysis.report.page import render

    assert f"took {w['total_ms']:,.1f} ms" in render(run)  # the report's operators section says it


def test_report_and_chrome_export_carry_the_ops(tmp_path):
    _, run = profiled(tmp_path, TRAIN, 12)
    from stepscope.analysis.export.formats import export
    from stepscope.analysis.report.page import render
    from stepscope.analysis.report.timeline import timeline_data

    html = render(run)
    assert "<h3>Forward: top operators</h3>" in html and "aten::addmm" in html
    detail = {(c["mode"], c["step"]) for c in timeline_data(run)["meta"]["detail_steps"]}
    assert {("train", 5), ("train", 6), ("train", 7)} <= detail
    folder = export(run, "chrome")
    (trace,) = [os.path.join(folder, f) for f in os.listdir(folder)]
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    addmm = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    assert len(addmm) == 6
    assert addmm[0]["args"]["Input Dims"] == [[64], [16, 32], [32, 64], [], []]
    assert isinstance(addmm[0]["args"]["Sequence number"], int)
    assert not [e for e in events if e.get("ph") == "C" and e.get("cat") == "op"]


def test_stepscope_steps_selects_exactly_those_steps(tmp_path):
    _, run = profiled(tmp_path, TRAIN, 30, STEPSCOPE_STEPS="10-13")
    ops = run.ops
    assert sampled_steps(ops) == [10, 11, 12, 13]
    per_step = ops[ops["phase"].isin(["Forward", "Backward", "Optimizer"])].groupby("step").size()
    assert per_step.nunique() == 1


EPOCHS = TRAIN.replace("for x, y in data:", "for x, y in (b for _ in range(3) for b in data):").replace(
    "batch_size=16)", "batch_size=16 * n // 8)")


def test_stepscope_steps_across_an_epoch_boundary(tmp_path):
    """8 steps an epoch: steps 6-10 are sampled in two windows (the loader's end closes
    the first), with an eval-free epoch change in between."""
    _, run = profiled(tmp_path, EPOCHS, 8, STEPSCOPE_STEPS="6-10")
    assert len(run.steps) == 24
    ops = run.ops
    assert sampled_steps(ops) == [6, 7, 8, 9, 10]
    assert (run.events["name"] == "stepscope.op_window").sum() == 2
    per_step = ops[ops["phase"].isin(["Forward", "Backward", "Optimizer"])].groupby("step").size()
    assert per_step.nunique() == 1


USER_PROFILER = """
import json, sys, torch, torch.nn as nn
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0); torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(8, 8), torch.randn(8, 1)
def step():
    opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()
start = int(sys.argv[1])
for i in range(start):
    step()
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for i in range(4):
        step()
prof.export_chrome_trace("trace.json")
for i in range(10):
    step()
with open("trace.json") as f:
    names = [e.get("name") for e in json.load(f)["traceEvents"]]
print("addmm", names.count("aten::addmm"), "sgd", names.count("Optimizer.step#SGD.step"))
"""


@pytest.mark.parametrize("start,window_open", [(0, False), (6, True)])
def test_user_profiler_gets_its_trace_and_no_window_runs_meanwhile(tmp_path, start, window_open):
    """The user's profiler runs from the first step (no window opens while it runs), or
    starts at step 6, inside stepscope's window of steps 5-7 (which yields, one line)."""
    r, run = profiled(tmp_path, USER_PROFILER, start)
    assert "addmm 8 sgd 4" in r.stdout  # the user's trace: 4 steps of 2 linears, complete
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("stepscope:")]
    assert len(lines) == (1 if window_open else 0), r.stderr
    ops = run.ops
    assert len(run.steps) == start + 14
    if window_open:
        assert "torch's profiler" in lines[0]
    user = run.steps[(run.steps["step"] >= start) & (run.steps["step"] < start + 4)]
    inside = ops[(ops["start_ns"] >= user["start_ns"].min()) & (ops["start_ns"] < user["end_ns"].max())]
    assert inside.empty  # nothing of stepscope's while the user's profiler ran
    if not window_open:  # the user's profiler ended at step 3: stepscope's window opens at 5
        assert sampled_steps(ops) == [5, 6, 7]
    else:  # the yielded window's ops are dropped
        assert ops.empty


GPU_TRACING_ON = """
import stepscope.core.gpu as gpu
calls = []
gpu.activity_tracing = lambda: True  # as where CUPTI traces: the window asks Kineto which activities it has
gpu.pause_activity_tracing = lambda: calls.append("pause")
gpu.resume_activity_tracing = lambda *a, **k: calls.append("resume")
""" + TRAIN + """
print("CALLS", calls)
"""


def test_window_asks_torch_for_its_activities_where_gpu_tracing_runs(tmp_path):
    """With stepscope's CUPTI tracing on, a window asks torch whether Kineto has CUDA
    (torch._C._autograd._supported_activities: a wrong name was only seen on a GPU, where
    every window then failed). On this CPU build: no CUDA, so CUPTI is never paused."""
    r, run = profiled(tmp_path, GPU_TRACING_ON, 12)
    assert "stepscope:" not in r.stderr, r.stderr[-2000:]
    assert "CALLS []" in r.stdout
    assert sampled_steps(run.ops) == [5, 6, 7]


@pytest.mark.slow
def test_window_cost_stays_small_on_a_longer_run(tmp_path):
    r, run = profiled(tmp_path, TRAIN, 20000)
    t0, t1 = map(int, r.stdout.split("LOOP")[1].split())
    steps, ops, ev = run.steps, run.ops, run.events
    sampled = sorted(set(ops["step"]))
    windows = ev[ev["name"] == "stepscope.op_window"]
    assert len(windows) >= 2 and sampled[:3] == [5, 6, 7]
    # cost: the sampled steps' time over the median step, plus closing and writing each window
    d = steps.set_index("step")["duration_ns"]
    median = float(np.median(d.to_numpy()))
    extra = float((d.loc[sampled] - median).clip(lower=0).sum()) + float(windows["duration_ns"].sum())
    share = extra / (t1 - t0)
    print(f"windows {len(windows)}, sampled steps {len(sampled)}, cost {extra / 1e6:.1f} ms, "
          f"{100 * share:.2f}% of the run")
    assert share < 0.02


def test_kernels_link_to_the_op_running_at_their_launch():
    """analysis/tables/ops.kernel_ops over plain tables (a real GPU run: test_gpu_fixtures.py):
    a kernel's launch call lies in the innermost op of its thread."""
    import pandas as pd

    from stepscope.analysis.tables.ops import kernel_ops

    ops = pd.DataFrame({"process": ["p"] * 3, "tid": [7, 7, 8], "name": ["aten::linear", "aten::addmm", "aten::mm"],
                        "start_ns": [100, 110, 100], "end_ns": [200, 190, 300]})
    api = pd.DataFrame({"process": ["p"] * 4, "correlation": [1, 2, 3, 4], "thread": [7, 7, 8, 9],
                        "start_ns": [120, 195, 150, 150]})
    kernels = pd.DataFrame({"process": ["p"] * 4, "correlation": [1, 2, 3, 4], "name": ["gemm", "bias", "mm", "x"],
                            "start_ns": [300, 310, 320, 330], "duration_ns": [5] * 4})
    linked = kernel_ops(kernels, api, ops).set_index("name")["op"].to_dict()
    assert linked == {"gemm": "aten::addmm", "bias": "aten::linear", "mm": "aten::mm"}


AGREE = """
import json, sys, torch, torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function
torch.manual_seed(0); torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
def step():
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
def profiled_steps():
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for i in range(30):
            with record_function("STEP"):
                step()
    events = [e for e in prof.events() if e.device_type.name == "CPU"]
    marks = [e.time_range for e in events if e.name == "STEP"]
    aten = [e for e in events if e.name.startswith("aten::")]
    per_step = [sum(e.self_cpu_time_total for e in aten if m.start <= e.time_range.start < m.end) for m in marks]
    counts = {n: sum(1 for e in aten if e.name == n) // 30
              for n in ("aten::addmm", "aten::mm", "aten::relu", "aten::add_")}
    return min(per_step), counts
for i in range(10):
    step()
before, counts = profiled_steps()  # steps 10-39
for i in range(50):  # stepscope's window: 50-79
    step()
after, _ = profiled_steps()  # steps 90-119
print("TORCH", json.dumps({"self_us": [before, after], "counts": counts}))
"""


def test_per_step_totals_agree_with_torch_profiler(tmp_path):
    """stepscope's window over steps 50-79 between two of the program's own torch.profiler
    sessions (steps 10-39, 90-119) of the same loop: the same ops per step, and the aten
    ops' self time of the least disturbed step within 10% of the span of torch's two
    (record_function ranges left out: the optimizer's contains its step hooks, stepscope's
    among them). The span, not one figure: on a shared machine torch's two sessions of
    one process differ by up to a quarter (571 and 743 us, seen in CI), and stepscope's
    window sits between them. A burst of load can slow one window as a whole, so the job
    runs up to three times."""
    seen = []
    for attempt in range(3):
        r, run = profiled(tmp_path, AGREE, name=f"agree{attempt}", STEPSCOPE_STEPS="50-79")
        theirs = json.loads(r.stdout.split("TORCH", 1)[1])
        ops = run.ops
        assert sampled_steps(ops) == list(range(50, 80))
        ours = {n: int((ops["name"] == n).sum()) // 30 for n in theirs["counts"]}
        assert ours == theirs["counts"]
        aten = ops[ops["name"].str.startswith("aten::")]
        mine = float((aten.groupby("step")["self_ns"].sum() / 1e3).min())
        lo, hi = sorted(theirs["self_us"])
        seen.append((round(mine), round(lo), round(hi)))
        print(f"aten self time per step: stepscope {mine:.0f} us, torch.profiler {lo:.0f}-{hi:.0f} us")
        if 0.9 * lo <= mine <= 1.1 * hi:
            return
    pytest.fail(f"per-step aten self time (stepscope; torch.profiler before and after) in us: {seen}")


class _Event211:
    """The part of torch 2.11's _KinetoEvent that classifies an event: no activity_type()
    (seen on an H200: its kernels and runtime calls were written as CPU ops)."""

    def __init__(self, name, device, annotation=False, nbytes=0, meta=""):
        self._name, self._device, self._annotation, self._nbytes, self._meta = name, device, annotation, nbytes, meta

    def name(self):
        return self._name

    def device_type(self):
        return getattr(torch._C._autograd.DeviceType, self._device)

    def is_user_annotation(self):
        return self._annotation

    def nbytes(self):
        return self._nbytes

    def metadata_json(self):
        return self._meta


@pytest.mark.parametrize("name,device,annotation,kind", [
    ("cudaLaunchKernel", "CPU", False, "cuda_runtime"),
    ("cudaMemcpyAsync", "CPU", False, "cuda_runtime"),
    ("cuLaunchKernel", "CPU", False, "cuda_driver"),
    ("aten::addmm", "CPU", False, "cpu_op"),
    ("Optimizer.step#SGD.step", "CPU", True, "cpu_op"),
    ("Optimizer.step#SGD.step", "CUDA", True, "gpu_user_annotation"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>(cutlass_80_simt_sgemm_64x64_8x5_tn_align1"
     "::Params)", "CUDA", False, "kernel"),
    ("Memcpy HtoD (Pinned -> Device)", "CUDA", False, "gpu_memcpy"),
    ("Memset (Device)", "CUDA", False, "gpu_memset"),
    ("Context Sync", "CUDA", False, "cuda_sync"),
    ("Stream Wait Event", "CUDA", False, "cuda_sync"),
])
def test_kineto_events_are_classified_without_activity_type(name, device, annotation, kind):
    from stepscope.integrations.torch import _op_events

    assert _op_events._kind(_Event211(name, device, annotation)) == kind


def test_copy_bytes_come_from_nbytes_or_the_metadata():
    from stepscope.integrations.torch import _op_events

    assert _op_events._nbytes(_Event211("Memcpy HtoD (Pinned -> Device)", "CUDA", nbytes=512)) == 512
    assert _op_events._nbytes(_Event211("Memcpy HtoD (Pinned -> Device)", "CUDA",
                                  meta='"device": 0, "bytes": 262144, "memory bandwidth (GB/s)": 21.1')) == 262144


def test_window_kernels_take_their_launch_configuration_from_kinetos_metadata():
    from stepscope.integrations.torch import _op_events

    meta = ('"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 3458, "registers per thread": 74, '
            '"shared memory": 20480, "blocks per SM": 0.06, "warps per SM": 0.24, "grid": [8, 1, 7], '
            '"block": [128, 1, 1], "est. achieved occupancy %": 0')
    cfg = _op_events._launch_config(_Event211("void cutlass::Kernel2<...>", "CUDA", meta=meta))
    assert cfg == {"grid": (8, 1, 7), "block": (128, 1, 1), "registers": 74, "dynamic_smem": 20480}
    assert _op_events._launch_config(_Event211("k", "CUDA", meta="")) == {}
