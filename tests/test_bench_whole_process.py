"""bench/whole_process.py as a smoke test (issue 61): the whole-process benchmark runs,
pairs plain and profiled processes, and prints every configuration's row with figures
a reader can use. Its figures are BENCHMARKS.md's; nothing here is timed."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "whole_process.py")


@pytest.mark.slow
def test_the_whole_process_benchmark_prints_every_part():
    out = subprocess.run([sys.executable, BENCH, "--quick", "--sizes", "0.3", "--breakdown", "--idle", "1"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^\| ([^|]+?) \| ([\d.]+)x \| ([\d.]+) \| ([\d.]+) \| ([+-][\d.]+) \| ([+-][\d.]+) \| ([+-][\d.]+) \| "
        r"([+-]\d+) \| ([+-][\d.]+) \|$", out.stdout, re.M)}
    assert set(rows) == {"STEPSCOPE=1", "no op windows", "no Python sampler", "no system sampler", "no flushes",
                         "hooks only"}, out.stdout
    for name, (ratio, p10, p90, us, us10, us90, _, cpu) in rows.items():
        # a ratio of two loops' times, not a stray figure (its size: BENCHMARKS.md; a smoke run on a busy
        # machine, two short loops, can be several times apart)
        assert 0.05 < float(ratio) < 50, (name, out.stdout)
        assert float(p10) <= float(p90) and float(us10) <= float(us90), (name, out.stdout)
        assert abs(float(cpu)) < 1e5, (name, out.stdout)  # microseconds of CPU a step, not a stray figure
    measured = re.search(r"measured plain: ([\d.]+) ms", out.stdout)
    assert measured and 0.01 < float(measured.group(1)) < 50, out.stdout
    assert re.search(r"CPU of one core while idle \(the sleep alone\): median -?[\d.]+%", out.stdout), out.stdout


IN_PROCESS = os.path.join(os.path.dirname(BENCH), "in_process.py")


def test_the_in_process_benchmark_pairs_every_configuration_with_a_plain_chunk():
    """bench/in_process.py (issue 61): sessions started and stopped around chunks of one
    process's training loop, every configuration beside a plain chunk; its rows parse."""
    out = subprocess.run([sys.executable, IN_PROCESS, "--rounds", "2", "--steps", "5", "--skip", "8"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^\| ([^|]+?) \| ([+-][\d.]+) us \(([+-][\d.]+), ([+-][\d.]+)\) \| ([\d.]+)x \| ([+-][\d.]+) us", out.stdout,
        re.M)}
    assert set(rows) == {"everything on", "no op windows", "no Python sampler", "no system sampler", "no flushes",
                         "hooks only"}, out.stdout
    for name, (median, p10, p90, ratio, cpu) in rows.items():
        assert float(p10) <= float(median) <= float(p90) and 0.05 < float(ratio) < 50, (name, out.stdout)
    assert re.search(r"plain step ([\d.]+) ms", out.stdout), out.stdout
