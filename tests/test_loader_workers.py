"""DataLoader workers record the work behind GetNext (integrations/torch/_workers.py):
a fetch span per batch with the worker id, in the worker's own process folder; the
Dataloader rule and the report's data-loading section name a slow worker."""

import os
import subprocess
import sys

import pytest

from test_torch import SCRIPTS, run_script

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope.analysis.report.page import render  # noqa: E402
from stepscope.analysis.report.summary import summarize  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_slow_worker_is_measured_and_named(tmp_path, context):
    run_script(tmp_path, os.path.join(SCRIPTS, "slow_worker.py"), context, name=context)
    run = stepscope.load(str(tmp_path / "runs" / context))
    ev = run.events
    fetch = ev[ev["name"].astype(str) == "DataLoader.fetch"]
    main = run.processes[run.processes["origin"] == "main"]["process"].iloc[0]
    assert not (fetch["process"] == main).any()  # the training process pays nothing for them
    per_worker = fetch.groupby("arg")["duration_ns"].agg(["size", "median"])
    assert per_worker["size"].to_dict() == {0: 8, 1: 8}  # 16 batches of 4, taken in turn
    assert per_worker.loc[1, "median"] >= 4 * per_worker.loc[0, "median"]
    assert per_worker.loc[1, "median"] >= 60e6  # 4 samples x 20 ms
    assert len(run.steps) == 16

    summary = summarize(run)
    dataloader = [f for f in summary["findings"] + summary.get("related_findings", []) if f["rule"] == "Dataloader"]
    assert len(dataloader) == 1 and dataloader[0]["evidence"]["slow_worker"]["worker"] == "1", dataloader
    assert dataloader[0]["evidence"]["pin_memory"] is False
    assert "worker 1" in dataloader[0]["message"]

    from stepscope.analysis.report.sections import rules_rows, worker_fetches
    from stepscope.compat.smdebug import PandasFrame

    # torch's own ranges named "enumerate(DataLoader)#..." (op spans, whose argument is an
    # op's) are not worker fetches: one once won the report's slowest-worker line (CI)
    assert set(worker_fetches(run)["worker"]) == {0, 1}
    rows = PandasFrame(str(tmp_path / "runs" / context)).get_all_dataloader_metrics()
    torch_ranges = rows[rows["framework_metric"].str.startswith("enumerate(DataLoader)")]
    assert (torch_ranges["worker_id"] == -1).all()

    (row,) = [r for r in rules_rows(summary) if r["rule"] == "Dataloader"]
    related = [f for f in summary.get("related_findings", []) if f["rule"] == "Dataloader"]
    assert row["status"] == ("related" if related else "triggered")  # never "passed" when it fired
    page = render(run)
    assert "The slowest worker:" in page and f"{main} worker 1," in page

    # --fail-on sees a finding folded under the one that explains it (it still fired)
    gate = subprocess.run([sys.executable, "-m", "stepscope", "summary", str(tmp_path / "runs" / context),
                           "--fail-on", "ERROR", "--param", "Dataloader.severity=error"],
                          capture_output=True, text=True)
    assert gate.returncode == 1 and "Dataloader" in gate.stderr, gate.stderr
