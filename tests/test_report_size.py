"""The report's size does not grow with the run (issue 20): the timeline keeps every span of a
few steps chosen for meaning and step-level coverage for the rest, plots have a ceiling of
points, and only plotly.js's cartesian bundle is inlined. The browser side (a 1 M-range run
under 3 MB, opening in under 2 s) is in test_report_browser.py."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import stepscope
from stepscope.analysis.report import plots
from stepscope.analysis.report.page import write_report
from stepscope.analysis.report.timeline_detail import (DETAIL_ITEMS, OVERVIEW_ITEMS, _finding_steps, choose_steps,
                                                parse_steps)

from conftest import run_python

MAX_REPORT_BYTES = 3_000_000


def _write(path, name, steps, per_step, with_steps=True):
    """Train steps of four phases with `per_step` annotations inside Forward, through the core."""
    r = run_python(f"""
        import stepscope
        from stepscope.core import _native
        # no system samples while the synthetic steps run (real-time events inside them would make
        # the steps' contents depend on how fast this machine writes them)
        run = stepscope.start(dir={str(path)!r}, name={name!r}, buffer_mb=128, interval_ms=60000, gpu="off")
        tpn = _native.clock_info()["ticks_per_ns"]
        phase, ann = stepscope.CATEGORIES.index("phase"), stepscope.CATEGORIES.index("annotation")
        ids = [_native.intern(p) for p in ("GetNext", "Forward", "Backward", "Optimizer")]
        layers = [_native.intern(f"layer{{k}}") for k in range(10)]
        span, us = _native.span, int(1000 * tpn)
        t = _native.now()
        for s in range({steps}):
            if {with_steps}:
                _native.begin_step("train", t)
            # three slowest steps, unequal: ties among the others would be broken by the
            # clock's rounding, which differs from run to run
            g = {{13: 2000, 20: 1500, 30: 1000}}.get(s % 97, 100) * us
            span(phase, ids[0], t, t + g)
            t += g + us
            span(phase, ids[1], t, t + {per_step} * 3 * us + us)
            for k in range({per_step}):
                span(ann, layers[k % 10], t + us + 3 * k * us, t + 3 * (k + 1) * us)
            t += {per_step} * 3 * us + 2 * us
            for p in (2, 3):
                span(phase, ids[p], t, t + 50 * us)
                t += 51 * us
        if {with_steps}:
            _native.end_step(t)  # the last step ends with its work, not with the (real-time) stop
        run.stop()
        print(run.stats["dropped"])
    """, cwd=path, timeout=300)
    assert r.returncode == 0 and r.stdout.split()[-1] == "0", r.stderr
    return stepscope.load(path / name, quiet=True)


def _meta(html_path):
    text = open(html_path, encoding="utf-8").read()
    return json.loads(re.search(r"id='tl-data'>(.*?)</script>", text).group(1))["meta"]


def test_size_does_not_grow_with_the_run(tmp_path):
    sizes, metas = {}, {}
    for steps in (2_000, 20_000):
        run = _write(tmp_path, f"s{steps}", steps, 20)
        out = write_report(run, str(tmp_path / f"s{steps}.html"))
        sizes[steps], metas[steps] = os.path.getsize(out), _meta(out)
    assert sizes[20_000] <= MAX_REPORT_BYTES
    # ten times the steps and spans: the page grows by a step plot's worth at most
    assert metas[20_000]["spans"] == 10 * metas[2_000]["spans"] == 500_000  # a step, 4 phases, 20 annotations
    assert sizes[20_000] < sizes[2_000] + 400_000, sizes
    for meta in metas.values():
        assert meta["items"] <= DETAIL_ITEMS + OVERVIEW_ITEMS
        assert 5 <= len(meta["detail_steps"]) <= 20
    # every span of a chosen step is there; the rest is one bar per track and step
    meta = metas[20_000]
    assert meta["detail_quantum_ns"] == 0 and meta["overview_steps_per_bar"] >= 1
    assert meta["detail_spans"] == 25 * len(meta["detail_steps"])


def test_a_run_without_steps_is_bounded_too(tmp_path):
    run = _write(tmp_path, "nosteps", 4_000, 20, with_steps=False)
    assert run.steps.empty
    out = write_report(run, str(tmp_path / "n.html"))
    meta = _meta(out)
    assert meta["spans"] == 96_000 and meta["items"] <= OVERVIEW_ITEMS and meta["overview_quantum_ns"] > 0
    assert os.path.getsize(out) <= MAX_REPORT_BYTES


def _steps(durations_ms, mode="train"):
    start = np.concatenate([[0], np.cumsum(durations_ms)[:-1]]) * 1e6
    return pd.DataFrame({"process": "p", "mode": mode, "step": np.arange(len(durations_ms)),
                         "start_ns": start.astype(np.int64),
                         "end_ns": (start + np.array(durations_ms) * 1e6).astype(np.int64),
                         "duration_ns": (np.array(durations_ms) * 1e6).astype(np.int64)})


def test_steps_chosen_for_meaning():
    d = [90.0, 40.0, 30.0] + [10.0 + (i % 7) * 0.1 for i in range(97)]  # three warm-up steps
    d[50], d[80], d[60] = 55.0, 45.0, 35.0
    steps = pd.concat([_steps(d), _steps([5.0, 6.0, 7.0], "eval")])
    findings = [{"rule": "StepOutlier", "evidence": {"outliers": [{"step": 71}, {"step": 72}], "steps": 1}},
                {"rule": "HostMemoryIncrease", "evidence": {"steps": [10, 99]}}]
    chosen = choose_steps(steps, findings, parse_steps("20-21"))
    why = {(c["mode"], c["step"]): c["why"] for c in chosen}
    assert why[("train", 0)] == "first step"
    assert "after warm-up" in why[("train", 3)] and "after warm-up" in why[("train", 4)]
    assert all("slowest" in why[("train", s)] for s in (50, 80, 60))
    assert ("train", 1) not in why  # warm-up steps are slow but not news
    assert "named by StepOutlier" in why[("train", 71)] and "named by HostMemoryIncrease" in why[("train", 99)]
    assert why[("train", 20)] == why[("train", 21)] == "asked for"
    assert any("median" in w for (m, _), w in why.items() if m == "train") and why[("eval", 1)] == "median step"
    assert len(chosen) <= 16


def test_finding_steps_and_step_ranges():
    assert _finding_steps({"worst_steps": [{"step": 5, "ms": 3}, {"step": 9}], "steps": 40,
                           "step_range": [2, 30], "step": True}) == [5, 9, 2, 30]
    assert parse_steps("10-20,35") == [(10, 20), (35, 35)]
    for bad in ("x", "5-2", "-3"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_plot_series_are_bounded():
    x = np.arange(100_000, dtype=float)
    tx, ty = plots.thin_series(x, x * 2, 1500)
    assert len(tx) == 1500 and np.allclose(ty, 2 * tx)  # means of consecutive samples
    cpu = pd.DataFrame({"device": np.repeat([f"cpu{i}" for i in range(64)], 36_000),
                        "timestamp_ns": np.tile(np.arange(36_000) * 100_000_000, 64), "value": 50.0})
    heat, cores = plots._heatmap(cpu, 0)
    z = heat.data[0].z
    assert cores == 64 and len(z) * len(z[0]) <= plots.HEAT_CELLS
    s = _steps([10.0] * 50_000)
    for p in (*plots.PHASES, plots.OTHER):
        s[p] = 1
    assert len(plots.thin(s, [*plots.PHASES, plots.OTHER], plots.BAR_POINTS)) == plots.BAR_POINTS


def test_cli_steps_keep_full_detail(tmp_path):
    run = _write(tmp_path, "asked", 3_000, 20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    out = subprocess.run([sys.executable, "-m", "stepscope", "report", str(run.path), "-o", "a.html",
                          "--steps", "1500-1502"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    meta = _meta(tmp_path / "a.html")
    asked = [c["step"] for c in meta["detail_steps"] if "asked for" in c["why"]]
    assert asked == [1500, 1501, 1502] and meta["detail_quantum_ns"] == 0
    bad = subprocess.run([sys.executable, "-m", "stepscope", "report", str(run.path), "--steps", "9-3"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--steps" in bad.stderr


def test_too_many_spans_in_the_chosen_steps_keep_the_most_telling_whole(tmp_path):
    run = _write(tmp_path, "wide", 40, 6_000)  # 6,005 spans a step: seven chosen steps would be 42 k
    meta = _meta(write_report(run, str(tmp_path / "w.html")))
    why = {c["step"]: c["why"] for c in meta["detail_steps"]}
    assert meta["detail_quantum_ns"] == 0 and meta["detail_spans"] <= DETAIL_ITEMS
    assert "slowest" in why[13] and sum("slowest" in w for w in why.values()) == 3
    assert 0 not in why  # the first step goes first
    assert DETAIL_ITEMS - 2 * 6_005 < meta["detail_spans"] and 4 <= len(why) <= 5  # the budget filled, step by step
