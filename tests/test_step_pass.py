"""The native steps-and-phases pass equals its definition (analysis/tables/stepping.py).

``stepping.steps_and_phases(events)`` runs the native pass
(csrc/aggregate/step_phases.cc); ``native=False`` runs the Python that defines
the two tables. Every column, dtype and value must match, on:

* random event tables built the way the reader builds them (several processes,
  loop threads, nested and overlapping phases, phases outside steps, end marks
  written for another thread, interrupted marks, the profiler's own windows
  inside phases, names that are not one of the five phases);
* a real PyTorch training run and the runs recorded on a real GPU
  (fixtures/gpu); the conformance corpus checks every corpus run the same way
  (tests/test_conformance.py, ``check_step_pass``).
"""

import os
import sys
import tarfile

import numpy as np
import pandas as pd
import pytest

import stepscope
from stepscope.analysis.store.reader import empty_events, start_order
from stepscope.analysis.tables import stepping
from stepscope.core.vocabulary import (CATEGORIES, END_MARK, EVENT_KINDS, INTERRUPTED, PHASES, TORCH_OP_WINDOW,
                                       TORCH_OP_WINDOW_OPEN)

from conftest import run_python

NAMES = [*PHASES, "train", "eval", END_MARK, INTERRUPTED, "Recompute", TORCH_OP_WINDOW, TORCH_OP_WINDOW_OPEN, "x"]


def assert_same(events: pd.DataFrame) -> None:
    native = stepping.steps_and_phases(events)
    reference = stepping.steps_and_phases(events, native=False)
    pd.testing.assert_frame_equal(native[0], reference[0])
    pd.testing.assert_frame_equal(native[1], reference[1])
    # the dataset build gives its events up (their columns go as they are read): the same tables
    given_up = events.copy()
    consumed = stepping.steps_and_phases(given_up, consume=True)
    pd.testing.assert_frame_equal(consumed[0], reference[0])
    pd.testing.assert_frame_equal(consumed[1], reference[1])


def _process_events(rng: np.random.Generator, threads: int) -> list:
    """(kind, category, name, tid, start, end, arg) rows of one process: loops on
    ``threads`` threads, each step a run of phases that sometimes nest or overlap."""
    rows = []
    for t in range(threads):
        tid = 100 + t
        at = int(rng.integers(0, 50_000))
        for number in range(int(rng.integers(0, 12))):
            mode = "train" if rng.random() < 0.8 else "eval"
            rows.append(("instant", "step", mode, tid, at, at, number))
            for phase in rng.choice(PHASES, size=int(rng.integers(0, 6))):
                length = int(rng.integers(0, 3_000))
                rows.append(("span", "phase", str(phase), tid, at, at + length, -1))
                if rng.random() < 0.25:  # a phase nested in this one (Forward inside LBFGS's Optimizer)
                    inner = int(rng.integers(0, length + 1))
                    rows.append(("span", "phase", str(rng.choice(PHASES)), tid, at + inner // 3, at + inner, -1))
                if rng.random() < 0.1:  # a name that is not one of the five
                    rows.append(("span", "phase", "Recompute", tid, at, at + length // 2, -1))
                if rng.random() < 0.15:  # the profiler's own window inside the phase
                    w = int(rng.integers(0, length + 1))
                    name = TORCH_OP_WINDOW if rng.random() < 0.5 else TORCH_OP_WINDOW_OPEN
                    rows.append(("span", "framework", name, tid, at + w // 2, at + w, -1))
                at += length + int(rng.integers(-200, 400))  # sometimes overlapping the phase before
            if rng.random() < 0.1:
                rows.append(("instant", "step", INTERRUPTED, tid, at, at, number - int(rng.integers(0, 2))))
            at += int(rng.integers(0, 2_000))
        if rng.random() < 0.3:  # the session's end mark, maybe written by another thread for this one
            other = rng.random() < 0.5
            rows.append(("instant", "step", END_MARK, 99 if other else tid, at, at, tid if other else 0))
        if rng.random() < 0.2:
            rows.append(("span", "phase", "Forward", tid, at + 10, at + 500, -1))  # after the last step's end
    if rng.random() < 0.3:
        rows.append(("span", "phase", "GetNext", 7, 0, int(rng.integers(1, 90_000)), -1))  # on a thread without steps
    if rng.random() < 0.5:
        rows.append(("counter", "system", "x", 1, 0, int(rng.integers(0, 200_000)), -1))
    return rows


def random_events(seed: int) -> pd.DataFrame:
    """An events table as the reader builds it: per process in start order, parents first."""
    rng = np.random.default_rng(seed)
    frames = []
    for p in range(int(rng.integers(1, 4))):
        rows = _process_events(rng, int(rng.integers(1, 4)))
        if not rows:
            continue
        kind, cat, name, tid, start, end, arg = (np.array(c) for c in zip(*rows))
        start, end = start.astype(np.int64), end.astype(np.int64)
        order = start_order(start, end)
        n = len(order)
        frames.append(pd.DataFrame({
            "process": np.full(n, f"proc{p}"), "pid": np.full(n, 1000 + p, dtype=np.int32), "host": "h",
            "rank": pd.array(np.full(n, p), dtype="Int32"), "tid": tid.astype(np.int64)[order],
            "kind": kind[order], "category": cat[order], "name": name[order], "start_ns": start[order],
            "end_ns": end[order], "duration_ns": (end - start)[order], "step": np.zeros(n, dtype=np.int32),
            "arg": arg.astype(np.int64)[order], "value": np.full(n, np.nan)}))
    if not frames:
        return empty_events()
    ev = pd.concat(frames, ignore_index=True)
    for column, categories in (("kind", EVENT_KINDS), ("category", CATEGORIES), ("name", NAMES)):
        ev[column] = pd.Categorical(ev[column], categories=categories)
    ev["process"] = ev["process"].astype("category")
    ev["host"] = ev["host"].astype("category")
    return ev


@pytest.mark.parametrize("seed", range(300))
def test_random_event_tables(seed):
    assert_same(random_events(seed))


def test_the_random_tables_reach_every_edge():
    """The generator does make what the cases above are about (else they prove little)."""
    seen = set()
    for seed in range(300):
        ev = random_events(seed)
        steps, phases = stepping.steps_and_phases(ev, native=False)
        seen.add("steps" if len(steps) else "no steps")
        if len(steps) and steps.groupby("process", observed=True)["tid"].nunique().max() > 1:
            seen.add("loop threads")
        if len(steps) and (steps["mode"] == INTERRUPTED).any():
            seen.add("interrupted")
        if len(phases) and (phases["exclusive_ns"] < phases["duration_ns"]).any():
            seen.add("nested")
        if len(phases) and (phases["step"] < 0).any():
            seen.add("outside")
        if len(steps) and (steps["Other"] > 0).any() and len(phases):
            seen.add("other")
    assert seen >= {"steps", "no steps", "loop threads", "interrupted", "nested", "outside", "other"}, seen


def test_a_real_torch_run(tmp_path):
    run_python(f"""
        import torch, stepscope, stepscope.integrations.torch as st_torch
        st_torch.instrument()
        run = stepscope.start(dir={str(tmp_path)!r}, name="r")
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1)),
                                             batch_size=8)
        for epoch in range(2):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        run.stop()
    """, tmp_path)
    events = stepscope.load(str(tmp_path / "r"), cache=False).events
    steps, phases = stepping.steps_and_phases(events)
    assert (steps["mode"] == "train").sum() == 16 and set(PHASES) <= set(phases["name"].astype(str))
    assert_same(events)


def test_the_gpu_fixture_runs(tmp_path):
    archive = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gpu", "h200-torch2.11-runs.tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data") if sys.version_info >= (3, 12) else tar.extractall(tmp_path)
    runs = [os.path.join(tmp_path, d) for d in sorted(os.listdir(tmp_path)) if os.path.isdir(os.path.join(tmp_path, d))]
    assert len(runs) == 2
    for path in runs:
        events = stepscope.load(path, cache=False, quiet=True).events
        assert len(stepping.steps_and_phases(events)[0]) >= 8
        assert_same(events)
