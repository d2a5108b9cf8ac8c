"""Runs written to order: steps of exact lengths, through the native record path, for tests of
rules whose judgement is about time (issue 74). A rule reads files, so its logic is tested on a
file whose every timestamp the test chose: the same verdict on an idle machine or a busy one.
The timestamps lie in the past of the writing session (it ends as it is written), so the
run's system samples, which the sampler takes as ever, cover none of its steps."""

import json

from conftest import run_python

PHASES = ("GetNext", "Forward", "Loss", "Backward", "Optimizer")
SHARES = (0.06, 0.30, 0.02, 0.50, 0.12)  # of a step's normal work, in order


def steps_run(tmp_path, name, steps_ms, extra_ms=None, mode="train", work_ms=None):
    """A run of one process whose train steps last ``steps_ms`` (a list, milliseconds):
    five phases share each step's work (``work_ms[i]``, default the step's length), and
    ``extra_ms[i]`` more of the step lies after its Optimizer, in no phase (Other: a stall,
    a log flush). Returns the run folder."""
    extra_ms = extra_ms or [0.0] * len(steps_ms)
    work_ms = work_ms or [s - e for s, e in zip(steps_ms, extra_ms)]
    spec = json.dumps({"work": work_ms, "extra": extra_ms, "mode": mode, "phases": PHASES, "shares": SHARES})
    r = run_python(f"""
        import json, stepscope
        from stepscope.core import _native
        spec = json.loads({spec!r})
        run = stepscope.start(dir={str(tmp_path / "runs")!r}, name={name!r}, interval_ms=1000, gpu="off",
                              pysample_hz=0)
        tpn = _native.clock_info()["ticks_per_ns"]
        phase = stepscope.CATEGORIES.index("phase")
        ids = [_native.intern(p) for p in spec["phases"]]
        total = sum(spec["work"]) + sum(spec["extra"])
        t = _native.now() - int((total + 50) * 1e6 * tpn)  # ends 50 ms before now
        for work, extra in zip(spec["work"], spec["extra"]):
            _native.begin_step(spec["mode"], t)
            for pid, share in zip(ids, spec["shares"]):
                d = int(work * share * 1e6 * tpn)
                _native.span(phase, pid, t, t + d)
                t += d
            t += int(extra * 1e6 * tpn)
        _native.end_step(t)
        run.stop()
        print(run.stats["dropped"])
    """, cwd=tmp_path, env={"STEPSCOPE_OPS": "0"}, timeout=120)
    assert r.returncode == 0 and r.stdout.split()[-1] == "0", r.stderr[-3000:]
    return tmp_path / "runs" / name
