"""Training patterns that were miscounted, each run unmodified under STEPSCOPE=1."""

import os
import time

import pytest

from test_torch import SCRIPTS, run_script

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402


def _load(tmp_path, kind):
    r = run_script(tmp_path, os.path.join(SCRIPTS, "patterns.py"), kind, name=kind)
    return r, stepscope.load(str(tmp_path / "runs" / kind))


def _phases_outside_steps(run):
    """The phase spans that begin in no step (by time: an eval step's mark is written
    after its phases, so the records' own step numbers do not tell)."""
    import numpy as np

    steps = run.steps.sort_values("start_ns")
    starts, ends = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    phases = run.phases
    i = np.searchsorted(starts, phases["start_ns"].to_numpy(), side="right") - 1
    inside = (i >= 0) & (phases["start_ns"].to_numpy() < ends[np.maximum(i, 0)])
    return phases[~inside]


def _small_model():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 4)


def test_forked_workers_after_break_write_no_steps(tmp_path):
    _, run = _load(tmp_path, "forkbreak")
    steps = run.steps
    main = steps[steps["process"] == steps["process"].iloc[0]]
    assert len(steps) == len(main) == 12, steps[["process", "mode", "duration_ns"]]
    assert set(steps["mode"]) == {"eval"}
    assert (steps["Forward"] > 0).all()


def test_epoch_start_of_workers_is_the_next_steps_getnext(tmp_path):
    r, run = _load(tmp_path, "epochs")
    loop_ns = int(r.stdout.split("loop_ns")[1].split()[0])
    steps = run.steps.sort_values("start_ns")
    assert len(steps) == 18 and set(steps["mode"]) == {"train"}
    ends = run.events[run.events["name"] == "end of data"]
    assert len(ends) == 3  # each epoch's last fetch (its workers shut down) is after its loop, named
    covered = steps["duration_ns"].sum() + (ends["end_ns"] - ends["start_ns"]).sum()
    # steps, and the named end of each epoch's data, cover the loop's wall time
    assert covered >= 0.97 * loop_ns, (covered, loop_ns)
    first_of_epoch = steps.iloc[[0, 6, 12]]["GetNext"]
    others = steps.drop(steps.index[[0, 6, 12]])["GetNext"]
    assert first_of_epoch.min() > others.median()  # worker start is in the first fetch


def test_acting_between_updates_is_part_of_the_train_step(tmp_path):
    """A DQN-style loop: each iteration a no_grad forward of the model (still in
    training mode) chooses an action, the environment steps (2 ms), then one update.
    The iteration is one train step from its acting forward on, not an eval step
    and a shorter train step. Before the first train step, the acting forwards are
    that step's data collection (issue 47 item 6: no evaluation ran): the 9 warm-up
    iterations and the first update are the first train step, no eval steps."""
    r, run = _load(tmp_path, "acting")
    steps = run.steps.sort_values("start_ns")
    assert steps.groupby("mode").size().to_dict() == {"train": 21}, steps[["mode", "duration_ns"]]
    train = steps[steps["mode"] == "train"]
    forwards = run.events[(run.events["category"] == "phase") & (run.events["name"] == "Forward")]
    per_step = [int(((forwards["start_ns"] >= s.start_ns) & (forwards["start_ns"] < s.end_ns)).sum())
                for s in train.itertuples()]
    assert per_step == [11] + [2] * 20, per_step  # the 10 warm-up actions and the update's forward first
    assert train["start_ns"].iloc[0] == forwards["start_ns"].min()  # it began at the first action
    # the environment's 2 ms fall inside the train steps, which cover the timed loop
    assert (train["duration_ns"].iloc[1:] > 2_000_000).all(), train["duration_ns"].tolist()
    assert train["duration_ns"].iloc[0] > 10 * 2_000_000, train["duration_ns"].tolist()
    loop_ns = int(r.stdout.split("loop_ns")[1].split()[0])
    assert train["duration_ns"].iloc[1:].sum() >= 0.9 * loop_ns, (train["duration_ns"].sum(), loop_ns)


def test_a_model_wrapper_named_like_a_loss_is_still_the_forward(tmp_path):
    """Criteria written as plain modules are losses by their class names (FocalLoss,
    LabelSmoothingCrossEntropy: conformance torch_custom_criterion); a ModelWithLoss,
    which trains the model's parameters, stays the Forward."""
    _, run = _load(tmp_path, "model_with_loss")
    steps = run.steps
    assert len(steps) == 6 and set(steps["mode"]) == {"train"}
    assert (steps["Forward"] > 0).all() and (steps["Backward"] > 0).all()
    phases = run.events[run.events["category"] == "phase"]
    assert int((phases["name"] == "Forward").sum()) == 6


def test_full_batch_training_is_one_step_per_optimizer_step(tmp_path):
    _, run = _load(tmp_path, "fullbatch")
    steps = run.steps
    assert len(steps) == 30 and set(steps["mode"]) == {"train"}
    assert (steps["Optimizer"] > 0).all() and (steps["Forward"] > 0).all()


@pytest.mark.parametrize("kind", ["transform_train", "transform_eval"])
def test_module_transforms_inside_the_fetch_are_getnext(tmp_path, kind):
    _, run = _load(tmp_path, kind)
    steps = run.steps
    assert steps.groupby("mode").size().to_dict() == {"train": 4, "eval": 4}
    assert (steps["Forward"] > 0).all() and (steps["GetNext"] > 0).all()
    assert steps["start_ns"].is_monotonic_increasing


def test_an_optimizer_step_that_raises_ends_there(tmp_path):
    """The third of six steps raises inside its optimizer step and the loop goes on:
    that step still ends (torch's range around the step exits), and the three after
    it begin at their fetches with every phase, as before it."""
    _, run = _load(tmp_path, "step_raises")
    steps = run.steps.sort_values("start_ns")
    assert len(steps) == 6 and set(steps["mode"]) == {"train"}, steps[["mode", "duration_ns"]]
    assert (steps["Forward"] > 0).all() and (steps["Backward"] > 0).all() and (steps["GetNext"] > 0).all()
    assert (steps["Optimizer"] > 0).all()


def test_an_optimizer_stepping_another_is_one_optimizer_phase(tmp_path):
    """A wrapper optimizer (Lookahead's shape) whose step steps an inner optimizer: the
    outer step is the step's Optimizer phase, once a step, the inner one inside it."""
    _, run = _load(tmp_path, "wrapped_optimizer")
    steps = run.steps
    assert len(steps) == 6 and set(steps["mode"]) == {"train"}
    assert (steps["Optimizer"] > 0).all() and (steps["Forward"] > 0).all()
    phases = run.phases
    assert (phases["name"] == "Optimizer").sum() == 6, phases.groupby("name", observed=True).size()


def test_a_forward_called_directly_is_one_forward(tmp_path):
    """net.forward(x), and inside it backbone.forward(x): their submodules are the roots
    found; their forwards are parts of one Forward a step (train over a loader, eval
    without one: each forward its own step). A teacher and a student called as modules
    stay two forwards."""
    _, run = _load(tmp_path, "direct_forward")
    steps = run.steps.sort_values("start_ns")
    assert steps["mode"].tolist() == ["train"] * 6 + ["eval"] * 4 + ["train"] * 3, steps[["mode", "duration_ns"]]
    assert (steps["Forward"] > 0).all()
    forwards = run.phases[run.phases["name"] == "Forward"].sort_values("start_ns")
    assert len(forwards) == 6 + 4 + 2 * 3, len(forwards)
    # each of the first ten spans runs from the first part's start to the last one's end:
    # inside its step, and the step's only Forward
    for (_, step), (_, span) in zip(steps.iloc[:10].iterrows(), forwards.iloc[:10].iterrows()):
        assert step["start_ns"] <= span["start_ns"] and span["end_ns"] <= step["start_ns"] + step["duration_ns"]


def test_second_model_is_timed_from_its_first_step(tmp_path):
    _, run = _load(tmp_path, "second_model")
    steps = run.steps
    assert len(steps) == 12 and (steps["Forward"] > 0).all(), steps[["Forward", "Backward"]]


def test_forked_workers_leave_no_unclosed_files_and_the_run_no_locks(tmp_path):
    r = run_script(tmp_path, "-X", "dev", os.path.join(SCRIPTS, "patterns.py"), "epochs", name="dev")
    assert "ResourceWarning" not in r.stderr, r.stderr[-2000:]
    run_dir = tmp_path / "runs" / "dev"
    leftovers = [p.name for p in run_dir.rglob("*") if p.name.endswith(".lock")]
    assert not leftovers, leftovers
    assert len(stepscope.load(str(run_dir)).steps) == 18


@pytest.mark.slow
def test_ddp_started_by_multiprocessing_spawn_has_its_ranks(tmp_path):
    run_script(tmp_path, os.path.join(SCRIPTS, "ddp_spawn.py"), "29757", name="mpspawn")
    run = stepscope.load(str(tmp_path / "runs" / "mpspawn"))
    procs = run.processes
    ranked = procs.dropna(subset=["rank"])
    assert sorted(ranked["rank"].astype(int)) == [0, 1], procs
    steps = run.steps
    assert steps.dropna(subset=["rank"]).groupby("rank").size().to_dict() == {0: 6, 1: 6}


def test_two_loops_in_two_threads_are_two_sequences_of_steps(tmp_path):
    r, run = _load(tmp_path, "threads")
    loader_ns, plain_ns = (int(v) for v in r.stdout.split("loop_ns")[1].split()[:2])
    steps = run.steps
    assert set(steps["mode"]) == {"train"}
    per_thread = steps.groupby("tid").size().sort_values()
    assert per_thread.tolist() == [20, 24], per_thread  # 20 without a loader, 2 epochs x 12 with one
    assert steps["step"].is_unique and sorted(steps["step"]) == list(range(44))
    for p in ("Forward", "Backward", "Optimizer"):
        assert (steps[p] > 0).all(), (p, steps[["tid", "step", p]])
    fed = steps[steps["tid"] == per_thread.index[1]]
    assert (fed["GetNext"] > 0).all()
    # each thread's steps follow one another without a gap inside a loader pass (the loader's
    # thread has one gap: between its two passes, where it may wait for the GIL), and no
    # step outlasts its loop (the last one of the loader's thread ends with its loader; the
    # other's where its work ended, marked at session end)
    for tid, wall, passes in ((per_thread.index[1], loader_ns, 2), (per_thread.index[0], plain_ns, 1)):
        s = steps[steps["tid"] == tid].sort_values("start_ns")
        gaps = s["start_ns"].to_numpy()[1:] - s["end_ns"].to_numpy()[:-1]
        assert (gaps >= 0).all() and (gaps > 0).sum() <= passes - 1, (tid, gaps)
        assert s["duration_ns"].sum() <= 1.05 * wall, (tid, s["duration_ns"].sum(), wall)
    from stepscope.analysis.report.summary import summarize

    assert summarize(run)["steps"]["train"]["count"] == 44  # the summary pools them per mode


def test_discovery_never_ends_inside_another_threads_call(tmp_path):
    """Discovery ending (a known root ran in the main loop) while another thread's first
    call of its model was between the discovery hooks: that thread must still see the
    call end, or every later forward of it counts as nested in it (no Forward phases)."""
    _, run = _load(tmp_path, "stranded")
    steps = run.steps
    per_thread = steps.groupby("tid").size().sort_values()
    assert per_thread.tolist() == [4, 24], per_thread  # the other thread; 4 passes of 6 batches
    for p in ("Forward", "Backward", "Optimizer"):
        assert (steps[p] > 0).all(), (p, steps[["tid", "step", p]])


def test_discovery_waits_for_a_thread_inside_its_first_fetch(tmp_path):
    """Root discovery ends once every running loop had a few steps without a new root: a
    thread still inside its first fetch runs a loop too, and its first forward is timed."""
    _, run = _load(tmp_path, "first_fetch")
    steps = run.steps
    per_thread = steps.groupby("tid").size().sort_values()
    assert per_thread.tolist() == [4, 12], per_thread  # 4 batches; 2 passes of 6 batches
    for p in ("GetNext", "Forward", "Backward", "Optimizer"):
        assert (steps[p] > 0).all(), (p, steps[["tid", "step", p]])


@pytest.mark.parametrize("kind", ["restarted_loader", "restarted_by_count"])
def test_a_second_loader_restarted_inside_the_loop_keeps_every_step_whole(tmp_path, kind):
    """A second loader read with next() and restarted inside the loop, where it runs out
    or by a count (FixMatch's unlabeled data): the restart is no loop end, and the batch
    fetched before it begins its step. Ended there, the fetch fell in the step before;
    where an operator window closed there too, the next step began before the previous
    one ended, and its phases fell outside every step."""
    r, run = _load(tmp_path, kind)
    loop_ns = int(r.stdout.split("loop_ns")[1].split()[0])
    steps = run.steps.sort_values("start_ns")
    assert len(steps) == 24 and set(steps["mode"]) == {"train"}
    for p in ("GetNext", "Forward", "Backward", "Optimizer"):
        assert (steps[p] > 0).all(), (p, steps[["step", p]])
    gaps = steps["start_ns"].to_numpy()[1:] - steps["end_ns"].to_numpy()[:-1]
    assert (gaps >= 0).all() and gaps.sum() < 0.02 * loop_ns, gaps
    outside = _phases_outside_steps(run)
    assert outside.empty, outside


def test_a_loop_ending_in_an_unused_batch_then_another_loop(tmp_path):
    """zip() of two loaders ends at the shorter one, the other's batch read and unused:
    the train loop ends with that fetch, and the validation pass that follows is a loop
    of its own. Its first step begins after the train loop's end, also where closing an
    operator window extended that end."""
    _, run = _load(tmp_path, "zip_then_eval")
    steps = run.steps.sort_values("start_ns")
    assert steps.groupby("mode").size().to_dict() == {"eval": 4, "train": 7}
    train, evals = steps[steps["mode"] == "train"], steps[steps["mode"] == "eval"]
    for p in ("GetNext", "Forward", "Backward", "Optimizer"):
        assert (train[p] > 0).all(), (p, train[["step", p]])
    assert (evals["Forward"] > 0).all() and (evals["GetNext"] > 0).all()
    assert evals["start_ns"].min() >= train["end_ns"].max()
    outside = _phases_outside_steps(run)
    assert outside.empty, outside


def test_a_dry_run_forward_is_a_step_as_long_as_its_forward(tmp_path):
    """A forward without grad on a dummy input before training (sizing the model) is an
    eval step of its own, which ends at its forward: the setup after it (0.3 s here) is
    no part of it, as it is no part of any step."""
    _, run = _load(tmp_path, "dry_run")
    steps = run.steps
    assert steps.groupby("mode").size().to_dict() == {"eval": 1, "train": 6}
    dry = steps[steps["mode"] == "eval"].iloc[0]
    assert dry["duration_ns"] == dry["Forward"], dry
    train = steps[steps["mode"] == "train"]
    assert train["start_ns"].min() - dry["end_ns"] >= 0.3e9
    assert (train["duration_ns"] < train["start_ns"].min() - dry["end_ns"]).all(), train["duration_ns"]  # no set-up


def test_an_eval_forward_inside_each_iteration_keeps_the_steps_contiguous(tmp_path):
    """The model in eval mode on the training batch (the training accuracy) after each
    train step is an eval step, and that step lasts until the next iteration begins: the
    bookkeeping after it (5 ms) is inside the loop, so inside a step (SPEC §3: steps add
    up to the loop). Only a forward before any training (a dry run) ends at itself."""
    r, run = _load(tmp_path, "train_accuracy")
    steps = run.steps.sort_values("start_ns")
    assert steps.groupby("mode").size().to_dict() == {"eval": 6, "train": 6}
    assert steps["mode"].tolist() == ["train", "eval"] * 6
    gaps = steps["start_ns"].to_numpy()[1:] - steps["end_ns"].to_numpy()[:-1]
    assert (abs(gaps) < 20_000).all(), gaps  # contiguous (within 20 us)
    evals = steps[steps["mode"] == "eval"]
    assert (evals["duration_ns"] >= 4_000_000).all(), evals["duration_ns"]  # the sleep is in them
    loop_ns = int(r.stdout.split("loop_ns", 1)[1].split()[0])
    covered = steps["end_ns"].max() - steps["start_ns"].min()
    assert covered >= 0.9 * loop_ns, (covered, loop_ns)


def test_discovery_waits_for_a_thread_that_made_an_optimizer(tmp_path):
    """A thread that made a new optimizer is about to train a model not seen yet: another
    loop's quiet steps do not end discovery before that thread's first step."""
    _, run = _load(tmp_path, "set_up_then_wait")
    steps = run.steps
    per_thread = steps.groupby("tid").size().sort_values()
    assert per_thread.tolist() == [4, 6], per_thread
    for p in ("Forward", "Backward", "Optimizer"):
        assert (steps[p] > 0).all(), (p, steps[["tid", "step", p]])


def test_a_thread_that_made_an_optimizer_and_never_steps_lets_discovery_end(tmp_path, monkeypatch):
    """The main thread makes the model and optimizer and another thread trains them: the
    main thread's claim to be setting up a loop expires, and discovery's global hooks go."""
    import threading

    from stepscope.integrations import torch as st_torch
    from stepscope.integrations.torch import _roots

    monkeypatch.setattr(_roots, "SET_UP_NS", 200_000_000)
    st_torch.instrument()
    try:
        run = stepscope.start(dir=str(tmp_path), name="handed_over")
        model, opt, x = _small_model()
        on = []

        def train(n):
            for _ in range(n):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            on.append(st_torch.instrumentor.roots.discovery is not None)

        def trainer():
            train(5)  # quiet steps, but the main thread is still setting up
            time.sleep(0.3)
            train(2)  # its claim expired

        thread = threading.Thread(target=trainer)
        thread.start()
        thread.join()
        run.stop()
    finally:
        st_torch.uninstrument()
    assert on == [True, False]
    assert len(stepscope.load(run.path).steps) == 7


def test_a_thread_python_did_not_start_makes_no_steps(tmp_path):
    """The autograd engine's device threads (GPUs) run checkpointing's recomputed forwards:
    threads Python did not start are never loops; their forwards are Recompute."""
    import _thread
    import threading

    from stepscope.integrations import torch as st_torch

    st_torch.instrument()
    try:
        run = stepscope.start(dir=str(tmp_path), name="foreign")
        model, opt, x = _small_model()
        for _ in range(3):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        done = threading.Event()

        def engine_thread():
            try:
                with torch.enable_grad():
                    model(x)
            finally:
                done.set()

        _thread.start_new_thread(engine_thread, ())
        assert done.wait(30)
        run.stop()
    finally:
        st_torch.uninstrument()
    loaded = stepscope.load(run.path)
    assert len(loaded.steps) == 3
    assert loaded.phases.groupby("name", observed=True).size().to_dict() == {
        "Forward": 3, "Loss": 3, "Backward": 3, "Optimizer": 3, "Recompute": 1}
