"""Configuration: keyword arguments over ``STEPSCOPE_*`` variables over defaults.

Every value is validated here, once, with an error that names the setting and
the values it allows (SPEC §2).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping, Optional, Tuple

from stepscope.core.vocabulary import DEFAULT_DIR, GPU_MODES

INTERVAL_MIN_MS, INTERVAL_MAX_MS = 10, 60000
PYSAMPLE_MAX_HZ = 1000  # a sample holds the GIL ~10-50 us: beyond this it would cost the job


class ConfigError(ValueError):
    """A setting has a value stepscope cannot use."""


@dataclasses.dataclass(frozen=True)
class Config:
    dir: str = DEFAULT_DIR
    name: Optional[str] = None  # None: derived from the script and start time
    interval_ms: int = 100
    gpu: str = "auto"
    steps: Optional[Tuple[int, int]] = None  # inclusive range of detailed steps; None: all
    flush_interval_ms: int = 1000
    buffer_mb: int = 32
    pysample_hz: int = 100  # Python stack samples per second; 0: none
    # Free space left to the job on the run's file system: the trace stops before
    # it would fall under the larger of the two (0 and 0: no floor).
    disk_floor_mb: int = 100
    disk_floor_pct: float = 1.0

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["steps"] = None if self.steps is None else f"{self.steps[0]}-{self.steps[1]}"
        return d


# keyword -> (environment variable, parser)
def _parse_int(label: str, value, lo: int, hi: int) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{label}={value!r} is not an integer; allowed: {lo} to {hi}") from None
    if not lo <= n <= hi:
        raise ConfigError(f"{label}={n} is out of range; allowed: {lo} to {hi}")
    return n


def _parse_float(label: str, value, lo: float, hi: float) -> float:
    try:
        x = float(str(value).strip())
    except ValueError:
        raise ConfigError(f"{label}={value!r} is not a number; allowed: {lo:g} to {hi:g}") from None
    if not lo <= x <= hi:  # NaN fails too
        raise ConfigError(f"{label}={value!r} is out of range; allowed: {lo:g} to {hi:g}")
    return x


def _parse_gpu(label: str, value) -> str:
    v = str(value).strip().lower()
    if v not in GPU_MODES:
        raise ConfigError(f"{label}={value!r} is not valid; allowed: {', '.join(GPU_MODES)}")
    return v


def parse_steps(label: str, value) -> Optional[Tuple[int, int]]:
    """``"10-20"`` -> (10, 20); ``"5"`` -> (5, 5); ``"all"``/empty -> None."""
    if value is None:
        return None
    if isinstance(value, (tuple, list, range)):
        items = list(value)
        if isinstance(value, range):
            items = [value.start, value.stop - 1]
        if len(items) != 2 or not all(isinstance(i, int) for i in items):
            raise ConfigError(f"{label}={value!r} must be two integers (first, last)")
        lo, hi = items
    else:
        s = str(value).strip()
        if s in ("", "all"):
            return None
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", s)
        if not m:
            raise ConfigError(f"{label}={value!r} is not valid; allowed: 'all', N or FIRST-LAST (e.g. 10-20)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
    if lo < 0 or hi < lo:
        raise ConfigError(f"{label}={value!r} is not valid; FIRST-LAST needs 0 <= FIRST <= LAST")
    return (lo, hi)


def _parse_name(label: str, value) -> Optional[str]:
    if value is None or str(value).strip() == "":
        return None
    s = str(value).strip()
    if "/" in s or s in (".", "..") or "\0" in s:
        raise ConfigError(f"{label}={value!r} is not valid; a run name cannot contain '/' or be '.' or '..'")
    return s


_FIELDS = {
    # keyword: (variable, parse(label, value))
    "dir": ("STEPSCOPE_DIR", lambda label, v: str(v) if str(v).strip() else DEFAULT_DIR),
    "name": ("STEPSCOPE_RUN", _parse_name),
    "interval_ms": ("STEPSCOPE_INTERVAL_MS", lambda label, v: _parse_int(label, v, INTERVAL_MIN_MS, INTERVAL_MAX_MS)),
    "gpu": ("STEPSCOPE_GPU", _parse_gpu),
    "steps": ("STEPSCOPE_STEPS", parse_steps),
    "flush_interval_ms": ("STEPSCOPE_FLUSH_MS", lambda label, v: _parse_int(label, v, 10, 60000)),
    "buffer_mb": ("STEPSCOPE_BUFFER_MB", lambda label, v: _parse_int(label, v, 1, 4096)),
    "pysample_hz": ("STEPSCOPE_PYSAMPLE_HZ", lambda label, v: _parse_int(label, v, 0, PYSAMPLE_MAX_HZ)),
    "disk_floor_mb": ("STEPSCOPE_DISK_FLOOR_MB", lambda label, v: _parse_int(label, v, 0, 1 << 30)),
    "disk_floor_pct": ("STEPSCOPE_DISK_FLOOR_PCT", lambda label, v: _parse_float(label, v, 0, 50)),
}

ENV_VARIABLES = tuple(var for var, _ in _FIELDS.values())


def resolve(env: Optional[Mapping[str, str]] = None, **kwargs) -> Config:
    """Builds a Config. Keyword arguments win over the environment.

    Raises ConfigError naming the keyword or the variable that is wrong.
    """
    env = os.environ if env is None else env
    unknown = set(kwargs) - set(_FIELDS)
    if unknown:
        raise TypeError(f"unknown stepscope option(s): {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(_FIELDS)}")
    values = {}
    for key, (var, parse) in _FIELDS.items():
        if kwargs.get(key) is not None:
            values[key] = parse(key, kwargs[key])
        elif env.get(var) is not None:
            values[key] = parse(var, env[var])
    return Config(**values)
