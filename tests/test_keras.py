"""Keras 3: real CPU training with the callback and with zero edits, TF backend
(jit_compile off and on) and torch backend."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("keras")
pytest.importorskip("tensorflow")

import stepscope
from conftest import stepscope_frames
from stepscope.core.vocabulary import COMPUTE_PHASES, KERAS_PROFILER_WINDOW, PHASES

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
PHASES = list(PHASES)
COMPUTE = list(COMPUTE_PHASES)


def _run(tmp_path, script, *args, zero_edit=False, clean=True, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE") and k != "KERAS_BACKEND"}
    env.update({"STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": "k", "TF_CPP_MIN_LOG_LEVEL": "3",
                **env_extra})
    if zero_edit:
        env["STEPSCOPE"] = "1"
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "done" in r.stdout
    if clean:
        assert "stepscope:" not in r.stderr, r.stderr[-3000:]
    return r


def _check_common(steps, expected):
    assert steps.groupby("mode", observed=True).size().to_dict() == expected
    shares = steps[PHASES].sum(axis=1) / steps["duration_ns"]
    assert (shares <= 1 + 1e-9).all(), shares.max()
    s = steps.sort_values("start_ns")
    assert (s["start_ns"].to_numpy()[1:] >= s["end_ns"].to_numpy()[:-1]).all(), "steps overlap"
    for mode, group in steps.groupby("mode", observed=True):
        assert sorted(group["step"]) == list(range(len(group))), mode


def _check_tf(run, sampled_steps=None):
    steps = run.steps
    # fit(numpy): 2 epochs x 10 + 2 x 2 validation; fit(dataset): 8; evaluate: 4; predict: 3
    _check_common(steps, {"train": 28, "eval": 8, "predict": 3})
    assert (steps["GetNext"] > 0).all(), "every step's fetch is timed"
    train = steps[steps["mode"] == "train"]
    sampled = train[train["Forward"] > 0]
    windows = run.events[run.events["name"] == KERAS_PROFILER_WINDOW]
    if sampled_steps is None:  # the default policy: one step in the middle of each epoch of 8-10 steps
        assert list(sampled["step"]) == [4, 14, 23]
        assert len(windows) == 3
    else:
        assert list(sampled["step"]) == sampled_steps
        assert len(windows) == 1
    assert (sampled[COMPUTE] > 0).all().all(), sampled[COMPUTE]
    # Backward and Optimizer are real work: each at least a tenth of Forward's
    assert (sampled[["Backward", "Optimizer"]].min(axis=1) > 0.1 * sampled["Forward"]).all()
    assert (steps[steps["mode"] != "train"][COMPUTE] == 0).all().all()
    _check_tf_ops(run, steps, sorted(sampled["step"]))
    return steps


def _check_tf_ops(run, steps, sampled):
    """The windows' TensorFlow ops: only in the sampled steps, inside them, each in the phase its
    name scope says (issue 15)."""
    ops = run.ops
    assert (ops["mode"] == "train").all() and sorted(ops["step"].unique()) == sampled
    assert all((ops["phase"] == p).any() for p in COMPUTE), ops.groupby("phase").size()
    forward = ops.loc[ops["phase"] == "Forward", "name"]
    assert any("matmul" in n.lower() or "dot" in n.lower() for n in forward), set(forward)
    at = steps.set_index(["mode", "step"]).loc[list(zip(ops["mode"], ops["step"]))]
    assert (ops["start_ns"].to_numpy() >= at["start_ns"].to_numpy()).all()
    assert (ops["start_ns"].to_numpy() < at["end_ns"].to_numpy()).all()
    assert ((ops["self_ns"] >= 0) & (ops["self_ns"] <= ops["duration_ns"])).all()
    summary = run.op_summary()
    assert set(summary["phase"]) >= set(COMPUTE) and (summary["steps"] == len(sampled)).all()


@pytest.mark.slow
@pytest.mark.parametrize("how,jit,sampled", [("callback", "nojit", None), ("plain", "nojit", "12-13"),
                                             ("callback", "jit", None), ("plain", "jit", None)])
def test_tf_backend_fit_evaluate_predict(tmp_path, how, jit, sampled):
    extra = {"STEPSCOPE_STEPS": sampled} if sampled else {}
    _run(tmp_path, "keras_fit.py", how, jit, zero_edit=how == "plain", **extra)
    run = stepscope.load(tmp_path / "runs" / "k")
    steps = _check_tf(run, sampled and [12, 13])
    if how == "callback" and jit == "nojit":  # the report of a Keras run: every section, its steps
        from stepscope.analysis.report.page import write_report

        html = open(write_report(run, str(tmp_path / "k.html"))).read()
        ids = re.findall(r'<section id="(\w+)"', html)
        # dataloading: tf.data's GetNext is there; flame: the Python stack sampler's; operators: the
        # windows' TensorFlow ops; no GPU sections on this machine
        # (compilation: the step function's tf.function traces)
        assert ids == ["verdict", "rules", "summary", "steps", "compilation", "dataloading", "system", "flame",
                       "operators", "timeline", "metadata"], ids
        assert f"{(steps['mode'] == 'train').sum()} (median" in html  # train steps in the job summary
        # compute phases are sampled: their shares stand for the sampled steps, GetNext's for all
        from stepscope.analysis.report.summary import summarize

        phases = summarize(run)["phases"]
        sampled = int((steps[(steps["mode"] == "train")][COMPUTE] > 0).any(axis=1).sum())
        assert all(phases[p]["sampled_steps"] == sampled for p in COMPUTE)
        assert "sampled_steps" not in phases["GetNext"]
        train = steps[steps["mode"] == "train"]
        for p in COMPUTE:  # over the sampled steps, not diluted by the others
            assert phases[p]["share"] > 2 * train[p].sum() / train["duration_ns"].sum()
        assert sum(p["share"] for p in phases.values()) <= 1.0


@pytest.mark.slow
def test_tf_backend_yields_to_tensorboard_profiler(tmp_path):
    pytest.importorskip("tensorboard")  # TF 2.21 no longer depends on it
    logs = tmp_path / "tb"
    r = _run(tmp_path, "keras_fit.py", "callback", "nojit", "tensorboard", str(logs), clean=False)
    lines = [line for line in r.stderr.splitlines() if line.startswith("stepscope:")]
    assert len(lines) == 1 and "yields" in lines[0], r.stderr[-3000:]
    # TensorBoard's own profile is written; every step is still counted
    assert any(f.endswith(".xplane.pb") for _, _, files in os.walk(logs) for f in files)
    run = stepscope.load(tmp_path / "runs" / "k")
    _check_common(run.steps, {"train": 28, "eval": 8, "predict": 3})


@pytest.mark.slow
def test_unknown_keras_version_is_one_line_and_same_results(tmp_path):
    unknown = _run(tmp_path, "keras_fit.py", "callback", "nojit", "unknown", clean=False)
    lines = [line for line in unknown.stderr.splitlines() if line.startswith("stepscope:")]
    assert len(lines) == 1 and "Keras 9.0.0 is not supported" in lines[0]
    assert not (tmp_path / "runs").exists()
    profiled = _run(tmp_path, "keras_fit.py", "callback", "nojit")
    assert unknown.stdout.split("checksum")[1] == profiled.stdout.split("checksum")[1]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["callback", "plain"])
def test_torch_backend_fit_and_custom_loop(tmp_path, how):
    pytest.importorskip("torch")
    _run(tmp_path, "keras_torch.py", how, zero_edit=how == "plain")
    run = stepscope.load(tmp_path / "runs" / "k")
    steps = run.steps
    # fit: 2 epochs x 10 + 2 x 2 validation; custom loop: 12; predict: 3
    _check_common(steps, {"train": 32, "eval": 4, "predict": 3})
    train = steps[steps["mode"] == "train"]
    assert (train[PHASES] > 0).all().all(), train[PHASES]
    others = steps[steps["mode"] != "train"]
    assert (others[["GetNext", "Forward"]] > 0).all().all()
    assert (others[["Backward", "Optimizer"]] == 0).all().all()
    ev = run.events
    counts = ev[(ev["category"] == "phase") & (ev["kind"] == "span")].groupby("name", observed=True).size()
    assert counts["Optimizer"] == 32 and counts["Backward"] == 32 and counts["Forward"] == 39


def _messages(stderr):
    """stderr lines without what differs between runs (absl's time/thread prefix, numbers, paths)."""
    import re

    out = []
    for line in stderr.splitlines():
        line = re.sub(r"^[IWEF]\d{4} [^\]]*\] ", "", line)
        out.append(re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?|/tmp/\S+", "#", line))
    return sorted(out)


@pytest.mark.slow
def test_profiler_windows_leave_the_jobs_stderr_as_it_was(tmp_path):
    """The sampled tf.profiler windows print nothing (TF logs at its default level here)."""
    plain = _run(tmp_path, "keras_fit.py", "plain", "nojit", TF_CPP_MIN_LOG_LEVEL="0")
    profiled = _run(tmp_path, "keras_fit.py", "plain", "nojit", zero_edit=True, TF_CPP_MIN_LOG_LEVEL="0")
    assert "Profiler session" not in profiled.stderr
    assert _messages(profiled.stderr) == _messages(plain.stderr)
    steps = stepscope.load(tmp_path / "runs" / "k").steps
    assert (steps[steps["mode"] == "train"][COMPUTE] > 0).any(axis=1).sum() > 0  # windows were sampled


def _failing_fit(tmp_path, name, profiled):
    """The corpus's failing-fit script (a fit with labels of the wrong shape, then a fit whose
    callback raises inside a profiler window), with TF logging at its default level."""
    script = os.path.join(os.path.dirname(SCRIPTS), "conformance", "keras_tf_fit_error.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE") and k not in (
        "KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL")}
    if profiled:
        env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="k")
    cwd = tmp_path / name
    cwd.mkdir()
    return subprocess.run([sys.executable, script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_failing_fit_keeps_its_traceback(tmp_path):
    """Issue 47: errors inside fit (one while the step is traced, one in a user's callback
    while a profiler window is open) print the plain run's stderr byte for byte: no stepscope
    frame, Keras's filter keeps the frame that raised, no "Profiler session tear down."; the
    failed step is flagged interrupted (issue 47 item 7)."""
    plain, profiled = _failing_fit(tmp_path, "plain", False), _failing_fit(tmp_path, "profiled", True)
    assert plain.returncode == profiled.returncode == 1
    stamp = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ ", re.MULTILINE)
    assert stamp.sub(r"\1 ", profiled.stderr) == stamp.sub(r"\1 ", plain.stderr)
    assert "nn.py" in plain.stderr and "stepscope:" not in profiled.stderr
    assert not stepscope_frames(profiled.stderr)
    steps = stepscope.load(tmp_path / "runs" / "k").steps
    # The first fit's failed step is no train step; the window the second fit left open is
    # read at stop: its steps completed, and their phases are the only ones measured.
    assert (steps["mode"] == "interrupted").sum() == 1 and (steps["mode"] == "train").sum() == 6
    assert (steps[steps["mode"] == "train"][COMPUTE] > 0).any(axis=1).sum() > 0


def test_a_loss_of_raw_ops_between_forward_and_gradients_is_loss():
    """A custom train_step's loss (raw ops, no compile_loss scope): the unscoped ops
    between the model's last forward op and the first gradient op are Loss; a metric
    updated after the gradients stays Other; a step with compile_loss keeps its scope."""
    from stepscope.integrations.keras._xspace import Op, Trace, split_step

    def op(t0, t1, phase):
        return Op(float(t0), float(t1), {phase: 1.0})

    trace = Trace(ops=[op(0, 10, "Forward"), op(10, 20, "Forward"), op(21, 24, None), op(24, 27, None),
                       op(28, 40, "Backward"), op(40, 50, "Optimizer"), op(50, 60, None)])
    spans = split_step(trace, 0.0, 100.0)
    lengths = {name: round(s1 - s0, 3) for name, s0, s1 in spans}
    busy = 20 + 6 + 12 + 10 + 10  # the loss's 6 of its 10 unscoped; the metric's 10 stay Other
    assert [name for name, *_ in spans] == ["Forward", "Loss", "Backward", "Optimizer"]
    assert lengths["Loss"] == pytest.approx(60 * 6 / busy, abs=1e-3)
    scoped = Trace(ops=trace.ops[:2] + [op(21, 24, "Loss"), op(24, 27, None)] + trace.ops[4:])
    assert {name: round(s1 - s0, 3) for name, s0, s1 in split_step(scoped, 0.0, 100.0)}["Loss"] == \
        pytest.approx(60 * 3 / busy, abs=1e-3)


def test_mixed_float16_update_ops_are_optimizer():
    """Issue 47 item 5: under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer
    (scope ``loss_scale_optimizer``) whose inner optimizer builds the update ops under its own
    scope: those ops are Optimizer, as are the wrapper's own."""
    import keras

    from stepscope.integrations.keras import _window

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, dtype="float32")])
        model.compile(optimizer=keras.optimizers.Adam(name="my_adam"), loss="mse")
        scopes = _window.Sampler(model, None).scopes
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert type(model.optimizer).__name__ == "LossScaleOptimizer"
    assert scopes.phase("StatefulPartitionedCall/my_adam/Sub") == "Optimizer"
    assert scopes.phase("StatefulPartitionedCall/loss_scale_optimizer/IsFinite") == "Optimizer"
    assert scopes.phase(f"StatefulPartitionedCall/{model.name}/dense/MatMul") == "Forward"


VALIDATION_EPOCHS = r"""
import os, sys, time
os.environ["KERAS_BACKEND"] = "tensorflow"
import keras, numpy as np

class Loop(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.t0 = time.time_ns()

    def on_train_end(self, logs=None):
        print("loop_ns", self.t0, time.time_ns())

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(640, 16)).astype("float32"), rng.normal(size=(640, 1)).astype("float32")
xv, yv = rng.normal(size=(160, 16)).astype("float32"), rng.normal(size=(160, 1)).astype("float32")
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=32, epochs=3, validation_data=(xv, yv), verbose=0, callbacks=[Loop()])
print("done")
"""


@pytest.mark.slow
def test_fit_with_validation_is_steps_or_named_epoch_boundaries(tmp_path):
    """Issue 47 item 3 (SPEC §3): every moment of a Keras-on-TF fit with validation is in a
    step or in a between-epochs interval the summary names, per epoch; no finding."""
    (tmp_path / "fit_validation.py").write_text(VALIDATION_EPOCHS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE") and k != "KERAS_BACKEND"}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="k", TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, str(tmp_path / "fit_validation.py")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-3000:]
    t0, t1 = (int(v) for v in r.stdout.split("loop_ns")[1].split()[:2])
    run = stepscope.load(tmp_path / "runs" / "k")
    steps = run.steps
    _check_common(steps, {"train": 60, "eval": 15})
    ev = run.events
    boundaries = ev[(ev["category"] == "framework") & ev["name"].isin(["keras.validation_start", "keras.epoch_end"])]
    assert boundaries.groupby("name", observed=True).size().to_dict() == {"keras.epoch_end": 3,
                                                                          "keras.validation_start": 3}
    covered = int(steps["duration_ns"].sum()) + int((boundaries["end_ns"] - boundaries["start_ns"]).sum())
    first = int(steps["start_ns"].min())
    assert covered >= 0.97 * (t1 - first), (covered, t1 - first)  # the loop from its first step on
    assert first - t0 < 0.5 * (t1 - t0)  # before it: the step function's first trace, no more
    from stepscope.analysis.report.summary import format_text, summarize

    summary = summarize(str(tmp_path / "runs" / "k"))
    between = summary["between_epochs"]
    assert between["epochs"] == 3 and set(between["parts"]) == {
        "validation start-up", "epoch end (callbacks, checkpointing, next epoch's start)"}
    assert "between epochs" in format_text(summary)
    assert [f["rule"] for f in summary["findings"]] == []
