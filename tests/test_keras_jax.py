"""Keras 3 on the JAX backend (issue 63): steps, GetNext timed at the step function's fetch,
the note on the compute phases JAX does not give, no finding on a healthy fit, and the job's
output unchanged (plain vs profiled), with real JAX on the CPU."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytest.importorskip("keras")

JOB = """
import numpy as np, keras
keras.utils.set_random_seed(0)
x, y = np.random.rand(640, 32).astype("float32"), np.random.rand(640, 1).astype("float32")
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
h = model.fit(x, y, batch_size=32, epochs=4, validation_split=0.2, verbose=0)
print("loss", round(h.history["loss"][-1], 4))
print("eval", round(model.evaluate(x[:320], y[:320], batch_size=32, verbose=0), 4))
print("predicted", model.predict(x[:96], batch_size=32, verbose=0).shape[0])
"""


def _run(tmp_path, profiled):
    script = tmp_path / "fit.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    if profiled:
        env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="jax")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, env


@pytest.mark.slow
def test_keras_fit_on_jax_has_steps_getnext_and_says_what_it_cannot_measure(tmp_path):
    plain, _ = _run(tmp_path, profiled=False)
    out, env = _run(tmp_path, profiled=True)
    assert out == plain  # the same losses and predictions
    s = json.loads(subprocess.run([sys.executable, "-m", "stepscope", "summary", "jax", "--json"], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=300).stdout)
    # 512 training rows in batches of 32 over 4 epochs; 128 validation rows (4 a pass) and evaluate's 10
    assert s["steps"]["train"]["count"] == 64 and s["steps"]["eval"]["count"] == 4 * 4 + 10
    assert s["steps"]["predict"]["count"] == 3
    assert s["phases"]["GetNext"]["count"] == 64  # every train step's fetch
    assert any("Keras on JAX" in n and "not measured" in n for n in s["notes"])
    assert s["findings"] == [], s["findings"]
    # the jitted steps' compiles (jax.monitoring), in the first train and the first eval step
    c = s["compilation"]
    assert c["jax_functions"]["train_step"]["compiles"] == 1 and c["jax_functions"]["test_step"]["compiles"] == 1
    assert ("train", 0) in {(x["mode"], x["step"]) for x in c["steps"]}
