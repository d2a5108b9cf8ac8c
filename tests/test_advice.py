"""Advice names the framework the run used: PyTorch DataLoader advice for torch and Lightning,
tf.data advice for tf.data and Keras on TensorFlow, generic advice for runs with neither."""

import os
import subprocess
import sys

import pandas as pd
import pytest

import stepscope
from stepscope.analysis.rules.advice import ADVICE, FRAMEWORKS, GENERIC, TENSORFLOW, TORCH, framework_of
from stepscope.analysis.report.summary import summarize
from stepscope.core.vocabulary import KERAS_PROFILER_WINDOW

from conftest import REPO, run_python

SCRIPTS = os.path.join(REPO, "tests", "scripts")
TORCH_WORDS = ("num_workers", "DataLoader", "pin_memory", "persistent_workers")
TF_WORDS = ("tf.data", "AUTOTUNE", "cache()")


class _Run:
    def __init__(self, versions, window=False):
        self.versions = {"python": "3.11", **{m: "1" for m in versions}}
        names = ["GetNext", KERAS_PROFILER_WINDOW] if window else ["GetNext"]
        self.events = pd.DataFrame({"name": pd.Categorical(names)})

    def select(self, names=None, columns=None, **_):  # stepscope.Run.select, on this table
        ev = self.events
        return ev[ev["name"].isin(names)] if names is not None else ev


@pytest.mark.parametrize("imported,window,expected", [
    (["torch"], False, TORCH),
    (["torch", "lightning"], False, TORCH),
    (["pytorch_lightning", "torch"], False, TORCH),
    (["tensorflow"], False, TENSORFLOW),                  # a tf.data loop
    (["tensorflow", "keras"], True, TENSORFLOW),          # Keras on TensorFlow
    (["keras", "jax", "tensorflow"], False, TENSORFLOW),  # Keras on JAX over tf.data
    (["torch", "tensorflow", "keras"], False, TORCH),     # Keras on torch imports TensorFlow too
    (["torch", "tensorflow", "keras"], True, TENSORFLOW),
    (["torch", "tensorflow"], False, GENERIC),            # cannot tell which fed the loop
    (["numpy", "pandas"], False, GENERIC),
])
def test_framework_from_what_the_run_imported(imported, window, expected):
    assert framework_of(_Run(imported, window)) == expected


def test_every_text_is_in_one_table():
    for key, texts in ADVICE.items():
        assert set(texts) <= set(FRAMEWORKS), key
    for key in ("feed", "overlap_reads", "offload", "cheaper_cpu", "sync"):
        torch, tf, generic = (ADVICE[key][f] for f in (TORCH, TENSORFLOW, GENERIC))
        assert any(w in torch for w in ("DataLoader", "pin_memory", "torch")), key
        assert not any(w in tf for w in TORCH_WORDS) and not any(w in generic for w in TORCH_WORDS), key
        assert not any(w in generic for w in TF_WORDS) and "tf." in tf, key
    feed = ADVICE["feed"][TENSORFLOW]
    assert all(s in feed for s in ("dataset.prefetch(tf.data.AUTOTUNE)",
                                   "map(..., num_parallel_calls=tf.data.AUTOTUNE)", "cache()"))


def _getnext_finding(run):
    (f,) = [f for f in summarize(run)["findings"] if f["rule"] == "GetNextBottleneck"]
    return f


@pytest.mark.slow
def test_keras_fit_on_a_slow_tf_data_pipeline_gets_tf_data_advice(tmp_path):
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE") and k != "KERAS_BACKEND"}
    # a window over train steps 3-6 sees the fetches of steps 4-6 (a step's fetch comes before its batch begins)
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="k", TF_CPP_MIN_LOG_LEVEL="3",
               STEPSCOPE_STEPS="3-6")
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "keras_slowdata.py"), "callback"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "done tensorflow" in r.stdout, r.stderr[-3000:]
    run = stepscope.load(tmp_path / "runs" / "k", quiet=True)
    # tf.data's own stages in the window: the 1 ms map of every sample is the slowest (tf.data fuses it
    # with the batch: MapAndBatch, 16 samples a call)
    from stepscope.analysis.tables.pipeline import tfdata_stages

    stages = tfdata_stages(run)
    top = stages.iloc[0]
    assert "Map" in top["stage"] and top["calls"] >= 3 and top["self_ms_per_call"] >= 0.9, stages
    assert top["self_ms"] > 0.8 * stages["self_ms"].sum(), stages
    if top["stage"] == "MapAndBatch":
        assert top["self_ms_per_call"] >= 16 * 0.9, stages
    f = _getnext_finding(run)
    assert f["evidence"]["framework"] == TENSORFLOW
    assert f["evidence"]["tfdata_slowest_stage"]["stage"] == top["stage"]
    rec = f["recommendation"]
    assert f"tf.data's slowest stage is {top['stage']}" in rec, rec
    from stepscope.analysis.report.page import render

    page = render(run)
    assert "tf.data pipeline stages" in page and f"data-stage='{top['stage']}'" in page
    for advice in ("dataset.prefetch(tf.data.AUTOTUNE)", "map(..., num_parallel_calls=tf.data.AUTOTUNE)",
                   "cache()"):
        assert advice in rec, rec
    assert not any(w in rec for w in TORCH_WORDS), rec


def test_torch_run_gets_dataloader_advice(tmp_path):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="t")
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "epochs.py"), "1", "plain", "0"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    f = _getnext_finding(stepscope.load(tmp_path / "runs" / "t", quiet=True))
    assert f["evidence"]["framework"] == TORCH
    assert "PyTorch DataLoader" in f["recommendation"] and "num_workers" in f["recommendation"]
    assert not any(w in f["recommendation"] for w in TF_WORDS)


def test_run_without_a_framework_gets_generic_advice(tmp_path):
    r = run_python(f"""
        import time, stepscope
        with stepscope.profile(dir={str(tmp_path / "runs")!r}, name="plain"):
            for i in range(40):  # (0.16 s of waiting: over the floor on a finding's total)
                stepscope.step()
                with stepscope.phase("GetNext"):
                    time.sleep(0.004)
                with stepscope.phase("Forward"):
                    time.sleep(0.001)
        print("done")
        """, cwd=tmp_path)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    f = _getnext_finding(stepscope.load(tmp_path / "runs" / "plain", quiet=True))
    assert f["evidence"]["framework"] == GENERIC
    assert not any(w in f["recommendation"] for w in TORCH_WORDS + TF_WORDS), f["recommendation"]
