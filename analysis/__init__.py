"""stepscope.analysis: runs on disk -> pandas tables, SQL and rules. Reads only the on-disk format."""

from stepscope.analysis.front import Run, load
from stepscope.analysis.store.reader import RunFormatError
from stepscope.analysis.tables.stepping import PHASES

__all__ = ["PHASES", "Run", "RunFormatError", "load"]
