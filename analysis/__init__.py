"""stepscope.analysis: runs on disk -> pandas tables, SQL and rules. Reads only the on-disk format."""

from stepscope.analysis.reader import RunFormatError
from stepscope.analysis.run import Run, load
from stepscope.analysis.tables import PHASES

__all__ = ["PHASES", "Run", "RunFormatError", "load"]
