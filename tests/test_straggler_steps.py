"""A straggler judged per step (issue 75): from collectives whose every arrival the test chose,
the rank the others wait for is named by its net cost per step, with the saving's interval,
and ranks that take turns are jitter. (The real DDP jobs: test_communication, test_rules.)"""

import numpy as np
import pandas as pd

from stepscope.analysis.rules.balance import per_step_straggler
from stepscope.analysis.rules.whatif import interval, sign_test
from stepscope.analysis.tables import comm

MS = 1_000_000


def _job(late_rank_of_step, steps=20, others=40, delay_ms=20.0, seed=0):
    """Two ranks; in each step a first collective at which ``late_rank_of_step(s)`` (None: no
    one) comes ``delay_ms`` late, then ``others`` collectives in a random order, each rank
    up to 0.3 ms after the other. An early rank is blocked until the last arrives.
    Returns (arrivals, blocked)."""
    rng = np.random.default_rng(seed)
    colls, blocked = [], []
    seq = 0
    for s in range(steps):
        t0 = s * 200 * MS
        late = late_rank_of_step(s)
        times = [(t0 + 5 * MS, {r: (delay_ms * MS if r == late else 0) for r in (0, 1)})]
        times += [(t0 + 30 * MS + j * MS, {r: int(rng.uniform(0, 0.3) * MS) for r in (0, 1)}) for j in range(others)]
        for base, offsets in times:
            seq += 1
            arrive = {r: base + offsets[r] for r in (0, 1)}
            last = max(arrive.values())
            for r in (0, 1):
                colls.append(("g", seq, "all_gather", r, f"p{r}", arrive[r], s))
                blocked.append((f"p{r}", arrive[r], last + 10_000))
    colls = pd.DataFrame(colls, columns=["group", "seq", "kind", "rank", "process", "start_ns", "step"])
    blocked = pd.DataFrame(blocked, columns=["process", "start_ns", "end_ns"])
    return comm.arrivals(colls, blocked), blocked


def test_a_rank_late_once_a_step_is_the_straggler_though_last_at_half_the_collectives():
    arr, blocked = _job(lambda s: 1)
    judged = per_step_straggler(arr, blocked)
    assert judged["rank"] == 1
    assert 0.4 < judged["last_share"] < 0.65  # counting arrivals would call it jitter
    assert judged["positive_steps"] == judged["steps_judged"] == 20 and judged["p_value"] < 1e-5
    saving = judged["saving"]
    assert abs(saving["ms_per_step"] - 20.0) <= 0.25 * 20.0  # the injected delay
    assert saving["low"] <= saving["ms_per_step"] <= saving["high"] and saving["high"] - saving["low"] < 2.0


def test_ranks_taking_turns_are_jitter():
    arr, blocked = _job(lambda s: s % 2)
    judged = per_step_straggler(arr, blocked)
    assert judged["p_value"] > 0.05, judged  # each rank costs the other in half the steps
    assert judged["saving"]["low"] < 0 < judged["saving"]["high"]


def test_steps_left_out_are_not_judged():
    arr, blocked = _job(lambda s: 1 if s < 4 else None)  # late only in steps 0-3 (a window stepscope opened)
    assert per_step_straggler(arr, blocked)["positive_steps"] >= 4
    judged = per_step_straggler(arr, blocked, left_out={0, 1, 2, 3})
    assert judged["steps_judged"] == 16 and judged["p_value"] > 0.01 and abs(judged["net_ms_per_step"]) < 1.0


def test_overlapping_waits_count_once_per_step():
    # two buckets awaited together: rank 0 blocked once, from its first bucket to rank 1's last
    colls = pd.DataFrame([("g", 1, "all_reduce", 0, "p0", 0, 0), ("g", 1, "all_reduce", 1, "p1", 8 * MS, 0),
                          ("g", 2, "all_reduce", 0, "p0", 1 * MS, 0), ("g", 2, "all_reduce", 1, "p1", 10 * MS, 0)],
                         columns=["group", "seq", "kind", "rank", "process", "start_ns", "step"])
    blocked = pd.DataFrame([("p0", 2 * MS, 10 * MS)], columns=["process", "start_ns", "end_ns"])
    waits = comm.waits_by_step(comm.arrivals(colls, blocked), blocked)
    assert waits.to_dict("records") == [{"rank": 0, "last_rank": 1, "step": 0, "waited_ns": 8 * MS}]


def test_sign_test_and_interval():
    assert sign_test(10, 0) == round(1 / 1024, 6) and sign_test(0, 0) == 1.0
    assert 0.5 < sign_test(5, 5) < 0.7
    assert sign_test(1100, 900) < 1e-5  # (the normal approximation)
    values = np.array([5.0, 6.0, 5.5, 4.5, 5.0, 6.5, 4.0, 5.5])
    low, high = interval(values)
    assert low < values.mean() < high and interval(values) == (low, high)  # the same run, the same interval
    assert interval(np.full(10, 3.0)) == (3.0, 3.0)
