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

Tests marked `slow` (the conformance corpus, the static-toolchain build: about 19 of
the suite's 36 CPU minutes) run where CI is set, as CI sets it (`CI=true`), and are left
out of a developer's run, which then takes about 12 minutes on 2 cores instead of 21.

With arguments (`python3 -m tox -- tests/test_torch.py -k compile`) pytest runs them as
given, in one process.
"""

import os
import subprocess
import sys
import tempfile
import time

PARALLEL = ["-n", "auto", "--dist", "loadgroup"]
OK, FAILED, NO_TESTS = 0, 1, 5


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
        print("[run_suite] leaving out the tests marked slow (the conformance corpus, the static-toolchain "
              "build); CI=true runs them too, as CI does", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        listed = os.path.join(tmp, "failed")  # conftest.py writes the failures there
        rc = pytest(*PARALLEL, "-m", "not alone" + slow, env={**os.environ, "RUN_SUITE_FAILED": listed})
        failed = []
        if os.path.exists(listed):
            with open(listed) as f:
                failed = list(dict.fromkeys(line.strip() for line in f if line.strip()))
    if rc == FAILED and failed:
        print(f"[run_suite] {len(failed)} test(s) failed with workers sharing the cores; "
              "running them again, one at a time:", *failed, sep="\n  ", flush=True)
        rc = pytest(*failed)
    if rc in (OK, NO_TESTS):
        rc = pytest("-m", "alone" + slow)
        rc = OK if rc == NO_TESTS else rc
    print(final_line(rc, failed), flush=True)
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
