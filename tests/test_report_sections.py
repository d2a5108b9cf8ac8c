"""The report's Debugger ProfilerReport sections (issue 14): the rules table, system statistics
per node, data loading, box plots per GPU. Real runs written through the core: a CPU run with
two child processes and per-worker fetch spans, and a GPU-shaped run (kernel records and NVML
samples written as CUPTI's decoder and the sampler write them; this machine has no GPU)."""

import base64
import collections
import json
import os
import re

import numpy as np
import pandas as pd
import pytest

import stepscope
from stepscope.analysis.report import sections as rs
from stepscope.analysis.report.page import write_report
from stepscope.analysis.rules import RULES
from stepscope.analysis.report.summary import summarize

from conftest import run_python

MAX_REPORT_BYTES = 3_000_000


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cpu")
    r = run_python(f"""
        import subprocess, sys, time
        import stepscope
        from stepscope.core import _native
        run = stepscope.start(dir={str(tmp)!r}, name="cpu", interval_ms=20, gpu="off")
        ann, fetch = stepscope.CATEGORIES.index("annotation"), _native.intern("DataLoader.fetch")
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"]) for _ in range(2)]
        for i in range(60):
            stepscope.step()
            with stepscope.phase("GetNext"):
                t = _native.now()
                time.sleep(0.02 if i % 10 == 0 else 0.004)
                _native.span(ann, fetch, t, _native.now(), i % 2)  # worker i % 2 fetched this batch
            with stepscope.phase("Forward"):
                time.sleep(0.005)
            with stepscope.phase("Backward"):
                time.sleep(0.005)
            with stepscope.phase("Optimizer"):
                time.sleep(0.001)
        stepscope.end_step()
        for k in kids:
            k.wait()
        run.stop()
    """, cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr
    run = stepscope.load(tmp / "cpu", quiet=True)
    return run, write_report(run, str(tmp / "cpu.html"))


def _html(path):
    return open(path, encoding="utf-8").read()


def _values(v):
    """A plotly JSON array: a list, or numpy's bytes as plotly.py 6 writes them (dtype, bdata)."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v)


def _sections(text):
    return re.findall(r'<section id="([^"]+)">', text)


def _figures(text, section):
    return [json.loads(m) for m in re.findall(rf'id="{section}-plot\d+-data">(.*?)</script>', text)]


def test_rules_table_lists_every_rule_with_its_trigger_count(cpu_run):
    run, out = cpu_run
    text = _html(out)
    summary = summarize(run)
    rows = dict(re.findall(r'data-rule="([^"]+)" data-triggered="(\d+)"', text))
    assert set(rows) >= {r.name for r in RULES}
    fired = collections.Counter(f["rule"] for f in summary["findings"])
    assert {k: int(v) for k, v in rows.items()} == {k: fired.get(k, 0) for k in rows}
    assert fired["GetNextBottleneck"] == 1  # a third of each step waits for its batch
    by = {r["rule"]: r for r in rs.rules_rows(summary)}
    for name, row in by.items():
        want = ("triggered" if fired.get(name) else
                "related" if name in {f["rule"] for f in summary.get("related_findings", [])} else
                "not applicable" if name in summary["rules_not_applicable"] else "passed")
        assert row["status"] == want, name
    assert by["LowGPUUtilization"]["status"] == "not applicable"  # no GPU here
    # parameters as used: the defaults, and an override where one was given
    assert by["GetNextBottleneck"]["params"]["threshold"] == RULES[0].params["threshold"].default
    changed = {r["rule"]: r for r in rs.rules_rows(summarize(run, {"GetNextBottleneck": {"threshold": 0.9}}))}
    assert changed["GetNextBottleneck"]["params"]["threshold"] == 0.9
    assert changed["GetNextBottleneck"]["status"] == "passed"
    html = rs.rules_html(summarize(run, {"GetNextBottleneck": {"threshold": 0.9}}), str)
    assert "threshold=0.9" in re.sub(r"\s+", " ", html)


def test_system_statistics_per_node_match_pandas(cpu_run):
    run, out = cpu_run
    stats = rs.system_stats(run.system)
    assert len(stats) and set(stats["node"]) == set(run.system["node"])
    s = run.system
    s = s[~s["metric"].str.startswith("proc_") & ~s["metric"].str.endswith("_total")].dropna(subset=["value"])
    dev = s["device"].where(~(s["metric"].str.startswith("cpu_") & s["device"].str.match(r"cpu\d+$")), "each core")
    want = s.assign(device=dev).groupby(["node", "metric", "device"])["value"].describe(percentiles=[.5, .95, .99])
    got = stats.set_index(["node", "metric", "device"])
    assert set(got.index) == set(want.index)
    for col, pcol in (("p50", "50%"), ("p95", "95%"), ("p99", "99%"), ("min", "min"), ("max", "max")):
        assert np.allclose(got[col], want.loc[got.index, pcol]), col
    assert (got["samples"] == want.loc[got.index, "count"]).all()
    assert ((got["min"] <= got["p50"]) & (got["p50"] <= got["p95"]) & (got["p95"] <= got["p99"])
            & (got["p99"] <= got["max"])).all()
    cpu = got.loc[(run.system["node"].iloc[0], "cpu_util", "all")]
    assert 0 <= cpu["min"] <= cpu["max"] <= 100
    text = _html(out)
    assert len(re.findall(r"<tr data-metric=", text)) == len(stats)
    assert "system statistics" in text


def test_dataloading_workers_getnext_and_per_worker_fetches(cpu_run):
    run, out = cpu_run
    (w,) = rs.loader_workers(run).itertuples(index=False)
    assert w.workers == 2 and w.training_processes == 1  # the two children, alive together
    assert w.cores == os.cpu_count() and w.workers_per_core == round(2 / w.cores, 2)
    g = rs.getnext_stats(run)
    ph = run.phases
    ms = ph[(ph["name"] == "GetNext") & (ph["mode"] == "train")]["duration_ns"] / 1e6
    assert g["count"].tolist() == [60]
    assert np.allclose(g[["p50", "p95", "p99", "max"]].iloc[0], [ms.median(), ms.quantile(.95), ms.quantile(.99),
                                                                  ms.max()])
    assert 3 < g["p50"].iloc[0] < 15 and g["max"].iloc[0] >= 20
    fetch = rs.worker_fetches(run)
    assert fetch.groupby("worker").size().to_dict() == {0: 30, 1: 30}
    text = _html(out)
    sections = _sections(text)
    assert sections[:5] == ["verdict", "rules", "summary", "steps", "dataloading"]
    figs = _figures(text, "dataloading")
    assert [f["data"][0]["type"] for f in figs] == ["bar", "box"]
    assert _values(figs[0]["data"][0]["y"]).sum() == 60
    box = figs[1]["data"][0]
    assert len(box["x"]) == 2 and "y" not in box  # five numbers a worker, never the samples
    for k, x in enumerate(box["x"]):
        v = fetch[fetch["worker"] == k]["ms"]
        assert x.endswith(f"worker {k}") and box["median"][k] == pytest.approx(v.median(), abs=1e-3)
        assert box["upperfence"][k] == pytest.approx(v.max(), abs=1e-3)


def test_gpu_sections_absent_on_a_cpu_run(cpu_run):
    run, out = cpu_run
    sections = _sections(_html(out))
    assert "gpu" not in sections and "gpu-usage" not in sections
    assert rs.gpu_boxes(run) == []


def _gpu_shaped_run(tmp):
    """Steps with a Forward launching kernels on two GPUs, and NVML samples of both: GPU 0
    busy and filling its memory, GPU 1 idle and nearly empty."""
    r = run_python(f"""
        import threading, time
        import stepscope
        from stepscope.core import _native, gpu_records as rec
        run = stepscope.start(dir={str(tmp)!r}, name="gpu", interval_ms=50, gpu="off")
        system, thread, GiB = stepscope.CATEGORIES.index("system"), threading.get_native_id(), 1 << 30
        def nvml(device, util, used):  # one NVML reading: every value at one instant
            at = _native.now()
            for metric, v in (("util", util), ("mem_used", used), ("mem_total", 80 * GiB)):
                _native.counter(system, _native.intern(f"gpu.{{metric}}|gpu{{device}}"), float(v), None, at)
        corr = 0
        for i in range(40):
            stepscope.step()
            with stepscope.phase("Forward"):
                t0 = time.monotonic_ns()
                for k in range(20):
                    corr += 1
                    rec.api("cudaLaunchKernel", t0 + 1000 * k, t0 + 1000 * k + 400, corr, thread=thread)
                    rec.kernel(f"gemm_{{k % 3}}", t0 + 20_000 + 1000 * k, t0 + 20_000 + 1000 * k + 800, corr,
                               device=k % 2)
                time.sleep(0.003)
            nvml(0, 80 + i % 20, (20 + i / 4) * GiB)
            nvml(1, i % 5, 1 * GiB)
        stepscope.end_step()
        run.stop()
    """, cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr
    return stepscope.load(tmp / "gpu", quiet=True)


def test_gpu_shaped_run_has_box_plots_per_gpu(tmp_path):
    run = _gpu_shaped_run(tmp_path)
    out = write_report(run, str(tmp_path / "gpu.html"))
    text = _html(out)
    sections = _sections(text)
    assert "gpu" in sections and sections.index("gpu-usage") == sections.index("gpu") + 1
    batch, memory = _figures(text, "gpu-usage")
    s = run.system
    assert [t["name"] for t in batch["data"]] == ["GPU utilization", "GPU memory used",
                                                  "CPU utilization (the GPU's node, all cores)"]
    for trace, metric in zip(batch["data"], ("gpu_util", "gpu_memory_used_percent", "cpu_util")):
        assert trace["type"] == "box" and trace["x"] == ["gpu0", "gpu1"]
        for k, device in enumerate(trace["x"]):
            on = (s["metric"] == metric) & (s["device"] == (device if metric != "cpu_util" else "all"))
            v = s[on]["value"].dropna()
            assert trace["median"][k] == pytest.approx(v.median(), abs=0.06)
            assert trace["q1"][k] == pytest.approx(v.quantile(.25), abs=0.06)
            assert trace["lowerfence"][k] == pytest.approx(v.min(), abs=0.06)
            assert trace["upperfence"][k] == pytest.approx(v.max(), abs=0.06)
    assert batch["data"][0]["median"][0] > 80 > 5 > batch["data"][0]["median"][1]
    (mem,) = memory["data"]
    used = s[(s["metric"] == "gpu_memory_used") & (s["device"] == "gpu0")]["value"] / 2**30
    assert mem["upperfence"][0] == pytest.approx(used.max(), abs=1e-3) and mem["median"][1] == pytest.approx(1.0)
    assert os.path.getsize(out) <= MAX_REPORT_BYTES


def test_box_plots_carry_five_numbers_whatever_the_samples():
    trace = rs.box_trace([("a", np.arange(1_000_000.0)), ("b", np.ones(3))], "x")
    payload = trace.to_plotly_json()
    assert payload["median"] == [499999.5, 1.0] and len(json.dumps(payload, default=list)) < 500
    assert pd.Series(payload["lowerfence"]).le(payload["q1"]).all()
