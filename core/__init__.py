"""stepscope.core: the tracing core's Python side (no framework imports here)."""

from stepscope.core.annotations import (CATEGORIES, annotate, annotation_begin, annotation_end,
                                        counter, end_step, phase, step)
from stepscope.core.config import Config, ConfigError
from stepscope.core.session import Session, current, profile, start, stop

__all__ = ["CATEGORIES", "Config", "ConfigError", "Session", "annotate", "annotation_begin",
           "annotation_end", "counter", "current", "end_step", "phase", "profile", "start", "step", "stop"]
