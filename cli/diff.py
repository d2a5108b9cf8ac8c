"""Moved to ``stepscope.analysis.diff``; these names stay importable from here."""

from stepscope.analysis.diff import diff, format_diff

__all__ = ["diff", "format_diff"]
