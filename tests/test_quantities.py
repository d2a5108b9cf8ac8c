"""One number per quantity: the summary, the report and the rules take their figures from
stepscope.analysis.quantities, and analysis/ stands on its own below the command line."""

import ast
import os

from conftest import REPO


def _imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_analysis_imports_nothing_from_the_command_line():
    offenders = []
    for root, _, files in os.walk(os.path.join(REPO, "analysis")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                offenders += [f"{name}: {m}" for m in _imports(path) if m.startswith("stepscope.cli")]
    assert not offenders, offenders


def test_summary_and_diff_live_in_analysis_and_keep_their_old_names():
    from stepscope.analysis import diff as analysis_diff
    from stepscope.analysis import summary as analysis_summary
    from stepscope.cli.diff import diff, format_diff
    from stepscope.cli.summary import format_text, summarize

    assert summarize is analysis_summary.summarize and format_text is analysis_summary.format_text
    assert diff is analysis_diff.diff and format_diff is analysis_diff.format_diff
