"""What users do with a run, in one place (issue 60): ``run = stepscope.load(path)``, then

    run.summary()          the dict of ``stepscope summary --json`` (SPEC §6)
    run.summary_text()     its text, as the CLI prints it
    run.findings           the rules' findings, a DataFrame (one row per finding)
    run.report(path=None)  the self-contained HTML report; returns its path
    run.export("perfetto") a trace or tables for other tools; returns the path
    run.diff(other)        what changed between two runs

beside the tables (``run.steps``, ``run.phases``, ``run.sql(...)``: ``analysis/run.py``).
A front over the analyses, as HTA's ``TraceAnalysis`` is: each method calls the module
that owns the analysis, so notebooks and examples need no internal import.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from stepscope.analysis.export.formats import export as _export
from stepscope.analysis.report.diff import diff as _diff
from stepscope.analysis.report.diff import format_diff
from stepscope.analysis.report.page import write_report
from stepscope.analysis.report.summary import format_text, summarize
from stepscope.analysis.run import Run as TablesRun

FINDING_COLUMNS = ["rule", "severity", "rank", "message", "recommendation", "cost_ms_per_step"]


class Run(TablesRun):
    """A loaded run: its tables, and what stepscope concludes from them."""

    def summary(self, params: Optional[dict] = None) -> dict:
        """The summary (SPEC §6); ``params``: {rule: {param: value}} for the rules."""
        if params:
            return summarize(self, params)
        return self.memo("front_summary", lambda: summarize(self))

    def summary_text(self, params: Optional[dict] = None) -> str:
        return format_text(self.summary(params))

    @property
    def findings(self) -> pd.DataFrame:
        """One row per finding, in the summary's order (``evidence`` as a dict column)."""
        rows = self.summary()["findings"]
        return pd.DataFrame([{**{c: f.get(c) for c in FINDING_COLUMNS}, "evidence": f.get("evidence", {})}
                             for f in rows], columns=[*FINDING_COLUMNS, "evidence"])

    def report(self, path: Optional[str] = None, steps: Optional[list] = None,
               params: Optional[dict] = None) -> str:
        """Writes the HTML report (default: report.html in the run folder); ``steps``:
        [(first, last)] train steps kept in full detail in its timeline."""
        return write_report(self, path, params, steps)

    def export(self, format: str, path: Optional[str] = None, steps: Optional[list] = None) -> str:
        """``format``: chrome, perfetto, parquet, speedscope, collapsed (``stepscope export``)."""
        return _export(self, format, path, steps=steps)

    def diff(self, other, params: Optional[dict] = None) -> dict:
        """What changed from this run to ``other`` (a Run or a run folder): ``stepscope diff``."""
        return _diff(self, other if isinstance(other, TablesRun) else load(other, quiet=True), params)

    def diff_text(self, other, params: Optional[dict] = None) -> str:
        return format_diff(self.diff(other, params))


def load(run, quiet: bool = False, cache: bool = True, dataset: Optional[bool] = None) -> Run:
    """Loads a run folder (or a run name under STEPSCOPE_DIR). ``dataset``: read it
    through its partitioned Parquet dataset (None: when it is large)."""
    return Run(run, quiet=quiet, cache=cache, dataset=dataset)
