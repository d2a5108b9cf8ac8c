"""stepscope.core: the tracing core's Python side (no framework imports here)."""

try:
    from stepscope.core import _native  # the compiled tracing core
except ImportError as exc:  # missing, another architecture's, an ABI mismatch
    raise ImportError(f"stepscope's native module could not be loaded ({exc}); reinstall stepscope for "
                      "this Python and platform: pip install --force-reinstall stepscope") from exc

from stepscope.core.config import native_settings as _native_settings

# The native core reads no environment: its settings come from the registry, now,
# before anything keeps a tick (the clock is chosen once, here).
_native.configure(**_native_settings())

# (imported after configure(): nothing keeps a tick of the clock it may change)
from stepscope.core.annotations import (CATEGORIES, annotate, annotation_begin, annotation_end,  # noqa: E402
                                        counter, end_step, phase, step)
from stepscope.core.config import Config, ConfigError  # noqa: E402
from stepscope.core.session import Session, current, profile, start, stop  # noqa: E402

__all__ = ["CATEGORIES", "Config", "ConfigError", "Session", "annotate", "annotation_begin",
           "annotation_end", "counter", "current", "end_step", "phase", "profile", "start", "step", "stop"]
