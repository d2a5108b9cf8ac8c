"""Moved to ``stepscope.analysis.summary``; these names stay importable from here."""

from stepscope.analysis.summary import format_text, summarize

__all__ = ["format_text", "summarize"]
