"""stepscope.core: the tracing core's Python side (no framework imports here)."""

try:
    from stepscope.core import _native  # noqa: F401 - the compiled tracing core
except ImportError as exc:  # missing, another architecture's, an ABI mismatch
    raise ImportError(f"stepscope's native module could not be loaded ({exc}); reinstall stepscope for "
                      "this Python and platform: pip install --force-reinstall stepscope") from exc

from stepscope.core.annotations import (CATEGORIES, annotate, annotation_begin, annotation_end,
                                        counter, end_step, phase, step)
from stepscope.core.config import Config, ConfigError
from stepscope.core.session import Session, current, profile, start, stop

__all__ = ["CATEGORIES", "Config", "ConfigError", "Session", "annotate", "annotation_begin",
           "annotation_end", "counter", "current", "end_step", "phase", "profile", "start", "step", "stop"]
