"""The ``stepscope`` command line (SPEC §5)."""

from stepscope.cli.main import main

__all__ = ["main"]
