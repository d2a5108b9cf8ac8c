"""stepscope.analysis: runs on disk -> pandas tables. Reads only the on-disk format."""

from stepscope.analysis.reader import PHASES, Run, RunFormatError, load

__all__ = ["PHASES", "Run", "RunFormatError", "load"]
