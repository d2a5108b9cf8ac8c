"""PyTorch, zero edits: real CPU training scripts under STEPSCOPE=1 and `stepscope run`."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
from stepscope.core.vocabulary import PHASES as _PHASES  # noqa: E402
PHASES = list(_PHASES)


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update({"STEPSCOPE_DIR": str(tmp_path / "runs")}, **extra)
    return env


def run_script(tmp_path, *args, name="run", zero_edit=True, timeout=300):
    env = _env(tmp_path, STEPSCOPE_RUN=name, **({"STEPSCOPE": "1"} if zero_edit else {}))
    r = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stepscope:" not in r.stderr, r.stderr[-3000:]
    return r


def phase_counts(run):
    ev = run.events
    ph = ev[(ev["category"] == "phase") & (ev["kind"] == "span")]
    return ph.groupby("name", observed=True).size().to_dict()


def check_steps(run, expected_modes):
    steps = run.steps
    assert steps.groupby("mode").size().to_dict() == expected_modes
    shares = steps[PHASES].sum(axis=1) / steps["duration_ns"]
    assert (shares <= 1.0 + 1e-9).all(), shares.max()
    for _, s in steps.groupby(["process", "mode"]):
        s = s.sort_values("start_ns")
        # contiguous within a loop: each step ends where the next begins (or at a loop end)
        gaps = s["start_ns"].to_numpy()[1:] - s["end_ns"].to_numpy()[:-1]
        assert (gaps >= 0).all()
    return steps


@pytest.mark.parametrize("kind,modes,phases", [
    ("manual", {"train": 12}, {"Forward": 12, "Loss": 12, "Backward": 12}),
    ("lbfgs", {"train": 12}, {"Optimizer": 12, "Forward": 36, "Loss": 36, "Backward": 36}),
    ("accum", {"train": 12}, {"Forward": 48, "Loss": 48, "Backward": 48, "Optimizer": 12}),
    ("gan", {"train": 12}, {"Forward": 60, "Loss": 36, "Backward": 24, "Optimizer": 24}),
    ("gan_mixed", {"train": 12}, {"Forward": 60, "Loss": 36, "Backward": 24, "Optimizer": 24}),
    ("ckpt", {"train": 12}, {"Forward": 12, "Loss": 12, "Backward": 12, "Optimizer": 12, "Recompute": 12}),
    ("evalonly", {"eval": 12}, {"Forward": 12}),
])
def test_loops_without_dataloader(tmp_path, kind, modes, phases):
    run_script(tmp_path, os.path.join(SCRIPTS, "loops.py"), kind)
    run = stepscope.load(tmp_path / "runs" / "run")
    check_steps(run, modes)
    assert phase_counts(run) == phases


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["loader", "loader_spawn", "loader_forkserver"])
def test_dataloader_with_workers_train_and_eval(tmp_path, kind):
    run_script(tmp_path, os.path.join(SCRIPTS, "loops.py"), kind, "8")
    run = stepscope.load(tmp_path / "runs" / "run")
    steps = check_steps(run, {"train": 16, "eval": 16})
    # 32 batches; the last, empty fetch of each of the 4 passes (worker shutdown) is after its loop
    assert phase_counts(run) == {"GetNext": 32, "Forward": 32, "Loss": 16, "Backward": 16, "Optimizer": 16}
    assert (run.events["name"] == "end of data").sum() == 4
    train = steps[steps["mode"] == "train"]
    assert (train[PHASES] > 0).all().all(), "every train step has every phase"
    # each worker (2 per pass, 4 passes) records its fetches in its own folder, and nothing else
    workers = run.processes[run.processes["origin"] != "main"]
    assert len(run.processes) == 9 and len(workers) == 8
    ev = run.events[run.events["process"].astype(str).isin(workers["process"])]
    fetches = ev[ev["name"].astype(str) == "DataLoader.fetch"]
    assert len(fetches) == 32 and set(fetches["arg"]) == {0, 1}
    assert not (ev["category"].isin(["phase", "step"])).any()


def test_step_time_adds_up_to_loop_wall_time(tmp_path):
    script = tmp_path / "timed.py"
    script.write_text(
        "import time, torch, torch.nn as nn\n"
        "m = nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "x = torch.randn(4, 8)\n"
        "t0 = time.time_ns()\n"
        "for i in range(20):\n"
        "    opt.zero_grad(); m(x).sum().backward(); opt.step()\n"
        "    time.sleep(0.005)  # logging: Other time in this step\n"
        "print('LOOP', t0, time.time_ns())\n")
    r = run_script(tmp_path, str(script))
    t0, t1 = map(int, r.stdout.split("LOOP")[1].split())
    steps = stepscope.load(tmp_path / "runs" / "run").steps
    assert len(steps) == 20
    total = int(steps["duration_ns"].sum())
    assert 0.9 * (t1 - t0) <= total <= (t1 - t0) * 1.01
    assert (steps["Other"].iloc[:-1] >= 5_000_000).all()  # the sleep is Other, in the step it follows


@pytest.mark.slow
@pytest.mark.parametrize("kind,backend", [("compile", "inductor"), ("mcompile", "eager")])
def test_torch_compile_adds_no_graph_breaks_and_keeps_phases(tmp_path, kind, backend):
    base = run_script(tmp_path, os.path.join(SCRIPTS, "loops.py"), kind, "12", backend, name="base",
                      zero_edit=False)
    prof = run_script(tmp_path, os.path.join(SCRIPTS, "loops.py"), kind, "12", backend)
    breaks = [line for line in prof.stdout.splitlines() if line.startswith("GRAPH_BREAKS")]
    assert breaks == [line for line in base.stdout.splitlines() if line.startswith("GRAPH_BREAKS")]
    run = stepscope.load(tmp_path / "runs" / "run")
    check_steps(run, {"train": 12})
    assert phase_counts(run) == {"Forward": 12, "Loss": 12, "Backward": 12, "Optimizer": 12}


@pytest.mark.slow
def test_a_module_compiled_before_instrument_is_a_root_and_compiles_as_without_stepscope(tmp_path):
    """torch.compile(model), then stepscope.start() and instrument() in code: root
    discovery's global hooks used to run inside the compiled forward, where dynamo
    traced them and failed (and torch warned of global hooks at every compiled call).
    The compiled module is found at instrument() and timed as a root, with no hooks."""
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        compiled = torch.compile(model, backend="aot_eager")
        if sys.argv[1] == "profiled":
            import stepscope, stepscope.integrations.torch as st_torch
            run = stepscope.start(dir="runs", name="run")
            st_torch.instrument()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        for _ in range(10):
            opt.zero_grad()
            loss = nn.functional.mse_loss(compiled(x), y)
            loss.backward()
            opt.step()
        print("LOSS", round(loss.item(), 5))
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    plain, prof = (subprocess.run([sys.executable, str(script), how], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=300) for how in ("plain", "profiled"))
    assert prof.returncode == 0, prof.stderr[-3000:]
    assert prof.stdout == plain.stdout and "LOSS" in prof.stdout
    assert "global hooks" not in prof.stderr and "stepscope:" not in prof.stderr, prof.stderr[-3000:]
    run = stepscope.load(tmp_path / "runs" / "run")
    check_steps(run, {"train": 10})
    assert phase_counts(run) == {"Forward": 10, "Loss": 10, "Backward": 10, "Optimizer": 10}


@pytest.mark.slow
def test_roots_timed_in_native_code_leave_fullgraph_compiles_whole(tmp_path):
    """A model and loss timed as roots (their slots hold native calls), then compiled
    with fullgraph=True around them: dynamo traces the modules' own calls, never
    the slot, so no graph break (it would raise) and the same numbers."""
    base = run_script(tmp_path, os.path.join(SCRIPTS, "loops.py"), "fullgraph", "12", "eager", name="base",
                      zero_edit=False)
    prof = run_script(tmp_path, os.path.join(SCRIPTS, "loops.py"), "fullgraph", "12", "eager")
    assert "LOSS" in prof.stdout and prof.stdout == base.stdout
    run = stepscope.load(tmp_path / "runs" / "run")
    check_steps(run, {"train": 12, "eval": 1})
    assert phase_counts(run)["Forward"] >= 7  # the eager half and the last call at least


def test_stepscope_run_launcher(tmp_path):
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--dir", "runs", "--name", "launched", "--",
                        sys.executable, os.path.join(SCRIPTS, "loops.py"), "accum", "5"],
                       cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "train" in r.stderr and "run written to" in r.stderr
    run = stepscope.load(tmp_path / "runs" / "launched")
    check_steps(run, {"train": 5})


@pytest.mark.slow
def test_torchrun_two_ranks_one_run(tmp_path):
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--dir", "runs", "--name", "ddp", "--",
                        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--standalone", os.path.join(SCRIPTS, "ddp.py")],
                       cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    run = stepscope.load(tmp_path / "runs" / "ddp")
    procs = run.processes
    ranks = procs[procs["rank"].notna()]
    assert sorted(ranks["rank"].astype(int)) == [0, 1]
    assert all(p.endswith(("-rank0", "-rank1")) for p in ranks["process"])
    steps = run.steps
    assert steps.groupby("rank").size().to_dict() == {0: 10, 1: 10}
    summary = json.loads(subprocess.run([sys.executable, "-m", "stepscope", "summary", "runs/ddp", "--json"],
                                        cwd=tmp_path, capture_output=True, text=True).stdout)
    assert summary["ranks"] == 2 and summary["steps"]["train"]["count"] == 20
    # torchrun's agent creates the run without a WORLD_SIZE; the ranks fill it in (issue 13).
    assert run.info["world_size"] == 2 and run.info["ranks"] == [0, 1]


def _accuracy_misses(tmp_path, attempt):
    name = f"acc{attempt}"
    r = run_script(tmp_path, os.path.join(SCRIPTS, "accuracy.py"), name=name)
    theirs = json.loads(r.stdout.split("TORCH")[1])
    steps = stepscope.load(tmp_path / "runs" / name).steps
    assert len(steps) == theirs["steps"]
    misses = []
    for phase in PHASES:
        ours_us = steps[phase].sum() / 1e3
        # torch's ranges hold the profiler's own cost of a range, measured in the same run:
        # take it out. optimizer.step() opens a range of its own inside the hand-placed one,
        # whose whole cost (entering and leaving it, not only its length) is torch's too.
        own = theirs["nested_range_overhead_us" if phase == "Optimizer" else "range_overhead_us"]
        torch_us = theirs["totals_us"][phase] - theirs["counts"][phase] * own
        # What stays: 8% (the Python stack sampler's GIL hand-offs land in one measurement or
        # the other), or per step twice torch's cost of a range holding a range on this machine
        # (the Python frames between a call and its hooks, Module.__call__'s and
        # Tensor.backward's, cost about as much when the step runs cold between matmuls)
        tolerance = max(0.08 * torch_us, len(steps) * 2 * theirs["nested_range_overhead_us"])
        if abs(ours_us - torch_us) > tolerance:
            misses.append((phase, round(ours_us), round(torch_us), round(tolerance)))
    return misses


# Two profilers' totals of one run agree within a few percent only where the scheduler leaves
# the run alone: beside two workers and a CPU hog a preempted range differed by 30% (a fresh
# clone beside `yes`), three attempts running; bench/overhead.py holds the figure
@pytest.mark.alone
def test_phase_totals_agree_with_torch_profiler(tmp_path):
    """Within 8% of hand-placed record_function ranges, or per step twice torch's own
    cost of a range holding a range, measured in the same run.

    Both profilers time the same run; what differs is each one's own cost inside
    the other's ranges. torch's is measured in the same run, on the machine that
    runs the test (tests/scripts/accuracy.py), and taken out of its totals; what
    stays is the noise of a busy neighbour. Up to three attempts."""
    misses = []
    for attempt in range(3):
        misses = _accuracy_misses(tmp_path, attempt)
        if not misses:
            return
    raise AssertionError(f"phase totals differ from torch.profiler's (phase, ours, torch, tolerance; us): {misses}")


def test_bad_setting_and_failing_hook_never_reach_the_script(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "loops.py"), "manual", "3"], cwd=tmp_path,
                       env=_env(tmp_path, STEPSCOPE="1", STEPSCOPE_GPU="cuda"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "done manual" in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "STEPSCOPE_GPU" in lines[0] and "auto, off, metrics, trace" in lines[0]

    # A hook that raises inside stepscope: reported once, instrumentation removed, training goes on.
    script = tmp_path / "broken.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "import stepscope.integrations._steps as steps\n"
        "def boom(*a, **k): raise RuntimeError('injected')\n"
        "steps.StepTracker.backward_ended = boom\n"
        "m = nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(5):\n"
        "    opt.zero_grad(); m(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "print('trained', bool(torch.isfinite(m.weight.detach()).all()))\n")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path, STEPSCOPE="1"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "trained True" in r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "injected" in lines[0], r.stderr


def test_instrument_is_idempotent_and_uninstrument_restores(run_dir):
    from torch.utils.data import dataloader

    from stepscope.integrations import torch as st_torch

    st_torch.uninstrument()
    original_iter = dataloader.DataLoader.__iter__
    original_f = torch.nn.functional.mse_loss
    assert st_torch.instrument()
    assert dataloader.DataLoader.__iter__ is not original_iter
    assert dataloader.DataLoader.__iter__.__qualname__ == original_iter.__qualname__
    assert torch.nn.functional.mse_loss is original_f  # functional losses are not patched (TorchScript)
    run = stepscope.start(name="inproc")
    _three_steps(torch.optim.SGD)
    run.stop()
    st_torch.uninstrument()
    assert dataloader.DataLoader.__iter__ is original_iter
    assert torch.nn.functional.mse_loss is original_f
    assert not torch.nn.modules.module._global_forward_pre_hooks
    r = stepscope.load(run.path)
    assert len(r.steps) == 3
    assert np.all(r.steps[["Forward", "Loss", "Backward", "Optimizer"]].to_numpy() > 0)


def test_eager_steps_and_new_epochs_run_no_python_frame_of_stepscopes(run_dir):
    """The hot path is native: neither a training step nor a new pass over a DataLoader
    (every 4 steps here) runs a Python function of stepscope's, and the steps are right."""
    from stepscope.integrations import torch as st_torch

    import stepscope.integrations

    # the package's folder (its subpackages' parent: an editable install maps them elsewhere)
    package = os.path.dirname(os.path.dirname(os.path.abspath(stepscope.integrations.__file__))) + os.sep
    tests = os.path.dirname(os.path.abspath(__file__)) + os.sep
    st_torch.uninstrument()
    assert st_torch.instrument()
    try:
        run = stepscope.start(name="no-frames")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
        loader = torch.utils.data.DataLoader(data, batch_size=8)

        def epochs(n):
            for _ in range(n):
                for x, y in loader:
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    opt.step()

        epochs(3)  # root discovery: its hooks run for the first steps of a new loader
        ours = []

        def profile(frame, event, arg):
            name = frame.f_code.co_filename
            if event == "call" and name.startswith(package) and not name.startswith(tests):
                ours.append(f"{name}:{frame.f_code.co_name}")

        sys.setprofile(profile)
        try:
            epochs(5)
        finally:
            sys.setprofile(None)
        run.stop()
    finally:
        st_torch.uninstrument()
    assert ours == []
    steps = stepscope.load(run.path).steps
    assert len(steps) == 32
    assert np.all(steps[["GetNext", "Forward", "Loss", "Backward", "Optimizer"]].to_numpy() > 0)


def _three_steps(optimizer_class):
    """Three steps of a linear model, its loss functional: Forward, Loss, Backward, Optimizer."""
    m = torch.nn.Linear(4, 1)
    opt = optimizer_class(m.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(torch.randn(2, 4)), torch.zeros(2, 1)).backward()
        opt.step()


def test_an_unhashable_optimizer_is_timed_and_never_hashed(run_dir, capsys):
    """An optimizer class with __eq__ and no __hash__ (a wrapper's): stepscope keeps
    optimizers by id, never in a set."""
    from stepscope.integrations import torch as st_torch

    class Compared(torch.optim.SGD):
        def __eq__(self, other):
            return self is other

    assert Compared.__hash__ is None
    st_torch.uninstrument()
    assert st_torch.instrument()
    run = stepscope.start(name="unhashable")
    _three_steps(Compared)
    run.stop()
    st_torch.uninstrument()
    assert "stepscope:" not in capsys.readouterr().err
    r = stepscope.load(run.path)
    assert len(r.steps) == 3 and (r.steps["Optimizer"] > 0).all()


def test_optimizer_hooks_are_native_until_something_compiles(tmp_path):
    """The optimizer step's pre-hook is a C callable (no Python frame a step) until
    torch.compile is called, then the Python one dynamo can trace; no post-hook
    runs either way (torch's Optimizer.step# range around the hooks ends the step)
    until a step runs outside such a range; steps and the Optimizer phase are the
    same on both sides; uninstrument() leaves none."""
    r = run_script(tmp_path, os.path.join(SCRIPTS, "optimizer_hooks.py"), str(tmp_path / "runs"), zero_edit=False)
    assert "dynamo imported True" in r.stdout
    assert "hooks eager ['OptimizerHook']" in r.stdout
    assert "hooks after eager steps ['OptimizerHook']" in r.stdout
    assert "hooks after compile ['function']" in r.stdout
    assert "compiled [2.0, 2.0]" in r.stdout
    # a step outside torch's range: the pre-hook registers the post-hook of its kind, which ends it
    assert "outside a range, python hooks ['function'] open 0 then ['function', 'function']" in r.stdout
    assert "outside a range, native hooks ['OptimizerHook'] open 0 then ['OptimizerHook', 'OptimizerHook']" \
        in r.stdout
    assert "hooks after uninstrument [] optimize restored True" in r.stdout
    run = stepscope.load(tmp_path / "runs" / "run")
    steps = check_steps(run, {"train": 11})  # 9 trained, 2 optimizer steps by hand
    trained = steps[steps["Forward"] > 0]
    assert len(trained) == 9 and (trained["Backward"] > 0).all()
    assert (steps["Optimizer"] > 0).all()
