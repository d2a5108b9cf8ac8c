"""The test suite as `tox` runs it: in parallel first, then what needs an idle machine.

1. Every test not marked `alone`, on pytest-xdist workers (one per CPU, at most four:
   conftest.py), tests sharing a module fixture kept in one worker.
2. The tests that failed there, once more, one at a time. Many tests time real work
   (phase shares, sampled stacks, busy cores); with two workers on two cores one can
   miss its bound only because the other worker took the core. On an idle machine a
   real failure fails again, and the run fails. A test that passes only on its rerun
   is not hidden: the last line of the run names every test that needed the rerun, so
   a test that fails on some machines is seen even when the run passes.
3. The tests marked `alone` (timing seen to need an idle machine), one at a time.

Tests marked `slow` (those over about 6 s on 2 cores: the conformance corpus, the fuzz
campaigns, the static-toolchain build, longer framework jobs: about 60% of the suite's CPU
time) run where CI is set, as CI sets it (`CI=true`), and are left out of a developer's run,
which then takes about 10 minutes on 2 cores, install included, instead of about 35.

With arguments (`python3 -m tox -- tests/test_torch.py -k compile`) pytest runs them as
given, in one process.

The budget (issue 74, README "Development"): every run ends with the suite's wall time and
its 20 slowest tests. Where CI is set, the run fails when the parallel part passes
PARALLEL_BUDGET_S (CI's own limit is 90 minutes for everything: a suite that grows past it
lands nothing, so it must fail here first, loudly, with the slowest tests named), or when
more than MAX_RERUNS tests needed their rerun (flakes are fixed, not absorbed).
RUN_SUITE_BUDGET_S overrides the budget.

The budget is in the reference machine's seconds (the project's 2-core VM): CI machines
differ by more than twofold from day to day (the same suite's parallel part took 32 minutes
there and 73 on a CI machine in 2026-12), and a budget in raw seconds would fail a suite that
did not grow on a day the machine is slow. The machine's pace is the fastest of three fresh
interpreters importing torch (the suite's commonest work: most tests start a framework
process), before and after the parallel part, the slower of the two kept; the parallel
part's time is scaled by REFERENCE_PACE_S over it. Both figures are printed.
"""

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

PARALLEL = ["-n", "auto", "--dist", "loadgroup"]
OK, FAILED, NO_TESTS = 0, 1, 5
PARALLEL_BUDGET_S = 40 * 60  # CI's parallel part, in reference seconds (28 min there on 2026-12-02); CI's limit: 90
REFERENCE_PACE_S = 1.05  # `import torch` in a fresh interpreter on the reference machine, quiet (2026-12-02)
PACE = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
MAX_RERUNS = 3  # CI fails when more tests than this needed the one-at-a-time rerun
SLOWEST = 20


def whole_suite() -> bool:
    """CI runs every test; a developer's run leaves out those marked `slow`."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest(*args, env=None):
    started = time.monotonic()
    rc = subprocess.call([sys.executable, "-m", "pytest", *args], env=env)
    shown = " ".join(args) if len(args) < 8 else " ".join(args[:6]) + f" ... ({len(args)} arguments)"
    print(f"[run_suite] pytest {shown}: exit {rc} after {time.monotonic() - started:.0f} s", flush=True)
    return rc


def main(args):
    if args:
        return pytest(*args)
    slow = "" if whole_suite() else " and not slow"
    if slow:
        print("[run_suite] leaving out the tests marked slow (over about 6 s: the conformance corpus, the fuzz "
              "campaigns, longer framework jobs); CI=true runs them too, as CI does", flush=True)
    paces = [machine_pace()]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        listed = os.path.join(tmp, "failed")  # conftest.py writes the failures there
        timings = os.path.join(tmp, "parallel.xml")
        rc = pytest(*PARALLEL, "-m", "not alone" + slow, f"--junitxml={timings}",
                    env={**os.environ, "RUN_SUITE_FAILED": listed})
        parallel_s = time.monotonic() - started
        failed = []
        if os.path.exists(listed):
            with open(listed) as f:
                failed = list(dict.fromkeys(line.strip() for line in f if line.strip()))
        durations = test_durations(timings)
    paces.append(machine_pace())
    pace = max((p for p in paces if p), default=None)
    if rc == FAILED and failed:
        print(f"[run_suite] {len(failed)} test(s) failed with workers sharing the cores; "
              "running them again, one at a time:", *failed, sep="\n  ", flush=True)
        rc = pytest(*failed)
    if rc in (OK, NO_TESTS):
        rc = pytest("-m", "alone" + slow)
        rc = OK if rc == NO_TESTS else rc
    print(timing_report(durations, parallel_s, time.monotonic() - started, pace), flush=True)
    rc = within_budget(rc, in_reference_seconds(parallel_s, pace), failed, whole_suite())
    print(final_line(rc, failed), flush=True)
    return rc


def test_durations(junit_xml: str) -> list:
    """(seconds, test id) of every test in a pytest JUnit XML file: setup, call and teardown
    together, as pytest-junitxml times a test case. Empty where the file is missing or bad."""
    try:
        cases = ET.parse(junit_xml).getroot().iter("testcase")
        return [(float(c.get("time") or 0), f"{c.get('classname', '')}::{c.get('name')}") for c in cases]
    except (OSError, ET.ParseError, ValueError):
        return []


def machine_pace():
    """Seconds a fresh interpreter here takes to import torch, the fastest of three after a
    warm-up (None where torch is missing or the probe fails: then no scaling)."""
    given = os.environ.get("RUN_SUITE_PACE")  # a figure instead of the probe (the suite's own tests of this file)
    if given:
        try:
            return float(given)
        except ValueError:
            pass
    times = []
    for _ in range(4):
        try:
            out = subprocess.run([sys.executable, "-c", PACE], capture_output=True, text=True, timeout=120)
            times.append(float(out.stdout.strip().splitlines()[-1]))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None
    return min(times[1:])


def in_reference_seconds(seconds: float, pace) -> float:
    """A time measured here, as the reference machine would have taken (unscaled without a pace)."""
    return seconds * REFERENCE_PACE_S / pace if pace else seconds


def timing_report(durations: list, parallel_s: float, total_s: float, pace=None) -> str:
    slowest = sorted(durations, reverse=True)[:SLOWEST]
    paced = (f"; this machine's pace: import torch {pace:.2f} s, {REFERENCE_PACE_S:.2f} s on the reference machine: "
             f"the parallel part is {in_reference_seconds(parallel_s, pace):.0f} reference s") if pace else ""
    lines = [f"[run_suite] wall time {total_s:.0f} s (parallel part {parallel_s:.0f} s, budget where CI is set "
             f"{budget_s():.0f} reference s{paced}); {len(durations)} tests took "
             f"{sum(d for d, _ in durations):.0f} s of worker time; the {len(slowest)} slowest:"]
    lines += [f"  {d:7.1f} s  {name}" for d, name in slowest]
    return "\n".join(lines)


def budget_s() -> float:
    try:
        return float(os.environ.get("RUN_SUITE_BUDGET_S") or PARALLEL_BUDGET_S)
    except ValueError:
        return float(PARALLEL_BUDGET_S)


def within_budget(rc: int, parallel_s: float, rerun: list, enforced: bool) -> int:
    """The run's exit code once the budget is checked: only where CI is set (a developer's busy
    laptop is no reason to fail), and only a passing run can fail on it."""
    if not enforced or rc != OK:
        return rc
    if parallel_s > budget_s():
        print(f"[run_suite] FAILED: the parallel part took {parallel_s:.0f} reference s, over its budget of "
              f"{budget_s():.0f} s "
              "(the slowest tests are listed above: make them faster, or share their runs)", flush=True)
        return FAILED
    if len(rerun) > MAX_RERUNS:
        print(f"[run_suite] FAILED: {len(rerun)} tests needed a rerun, more than {MAX_RERUNS}: fix the flaky ones "
              "(they are named on the last line)", flush=True)
        return FAILED
    return rc


def final_line(rc, rerun):
    """The run's verdict, naming every test that needed a rerun: one that fails with the
    workers and passes alone is flaky on this machine, and a passing run must not hide it."""
    verdict = "passed" if rc == OK else f"FAILED (exit {rc})"
    if not rerun:
        return f"[run_suite] {verdict}; no test needed a rerun"
    return (f"[run_suite] {verdict}; {len(rerun)} test(s) needed a rerun (failed beside the other "
            f"workers{', passed alone' if rc == OK else ''}): " + ", ".join(rerun))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
