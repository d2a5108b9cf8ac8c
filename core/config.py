"""Configuration: keyword arguments over ``STEPSCOPE_*`` variables over defaults.

Every value is validated here, once, with an error that names the setting and
the values it allows (SPEC §2). ``VARIABLES`` is the one registry of every
``STEPSCOPE_*`` variable: what it means, who sets it (the user, or stepscope
handing a value to its child processes), how it is parsed. Nothing else parses
them: the native core gets its values from here (``native_settings``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import Callable, Mapping, Optional, Tuple

from stepscope.core.vocabulary import DEFAULT_DIR, GPU_MODES

INTERVAL_MIN_MS, INTERVAL_MAX_MS = 10, 60000
PYSAMPLE_MAX_HZ = 1000  # a sample holds the GIL ~10-50 us: beyond this it would cost the job


SHOWN_CHARS = 80  # a value echoed in an error is cut here: a 100 kB variable stays one short line
NAME_MAX_BYTES = 255  # one path component (NAME_MAX on Linux and macOS)
PATH_MAX_BYTES = 4095


class ConfigError(ValueError):
    """A setting has a value stepscope cannot use."""


def shown(value) -> str:
    """``repr(value)`` for a one-line message: escaped, and cut to SHOWN_CHARS with '...'."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _utf8_problem(text: str) -> Optional[str]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes the file system encoding could not decode (surrogate escapes)
        return "it is not UTF-8 text"
    return "it contains a NUL character" if "\0" in text else None


def run_name_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be a run folder (one path component inside the runs folder), or None."""
    problem = _utf8_problem(name)
    if problem:
        return problem
    if name.strip() in ("", ".", ".."):
        return "it is empty, '.' or '..'"
    if "/" in name or (os.altsep and os.altsep in name) or os.sep in name:
        return "it contains a path separator"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "it contains a control character"
    if len(name.encode("utf-8")) > NAME_MAX_BYTES:
        return f"it is longer than {NAME_MAX_BYTES} bytes"
    return None


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
        raise ConfigError(f"{label}={shown(value)} is not an integer; allowed: {lo} to {hi}") from None
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
        raise ConfigError(f"{label}={shown(value)} is not valid; allowed: {', '.join(GPU_MODES)}")
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
            raise ConfigError(f"{label}={shown(value)} must be two integers (first, last)")
        lo, hi = items
    else:
        s = str(value).strip()
        if s in ("", "all"):
            return None
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", s)
        if not m:
            raise ConfigError(f"{label}={shown(value)} is not valid; allowed: 'all', N or FIRST-LAST (e.g. 10-20)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
    if lo < 0 or hi < lo:
        raise ConfigError(f"{label}={shown(value)} is not valid; FIRST-LAST needs 0 <= FIRST <= LAST")
    return (lo, hi)


def _parse_name(label: str, value) -> Optional[str]:
    if value is None or str(value).strip() == "":
        return None
    s = str(value).strip()
    problem = run_name_problem(s)
    if problem:
        raise ConfigError(f"{label}={shown(value)} is not valid: {problem}; a run name is one folder name "
                          f"(no '/', not '.' or '..', at most {NAME_MAX_BYTES} bytes of UTF-8)")
    return s


def _parse_dir(label: str, value) -> str:
    s = os.fspath(value) if isinstance(value, os.PathLike) else value
    if isinstance(s, bytes):
        s = os.fsdecode(s)
    s = str(s)
    if not s.strip():
        return DEFAULT_DIR
    problem = _utf8_problem(s)
    if problem is None and len(s.encode("utf-8")) > PATH_MAX_BYTES:
        problem = f"it is longer than {PATH_MAX_BYTES} bytes"
    if problem:
        raise ConfigError(f"{label}={shown(value)} is not valid: {problem}")
    return s


def _checked_text(parse):
    """``parse`` for a text setting, after the checks every value gets: UTF-8, no NUL."""
    def checked(label: str, value):
        if isinstance(value, str):
            problem = _utf8_problem(value)
            if problem:
                raise ConfigError(f"{label}={shown(value)} is not valid: {problem}")
        return parse(label, value)

    return checked


_FIELDS = {
    # keyword: (variable, parse(label, value))
    "dir": ("STEPSCOPE_DIR", _parse_dir),
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
        parse = _checked_text(parse)
        if kwargs.get(key) is not None:
            values[key] = parse(key, kwargs[key])
        elif env.get(var) is not None:
            values[key] = parse(var, env[var])
    return Config(**values)


# ------------------------------------------------------------ the registry

#: What turns a boolean variable off (any other non-empty value turns it on): the
#: same words everywhere, package/_stepscope_autostart.py's copy included.
OFF_WORDS = ("0", "false", "no", "off")


def parse_flag(label: str, value) -> bool:
    """The one boolean parser: an off word (any case, spaces around) -> False, anything
    else -> True. Never raises: a switch is never what stops a job. (Empty is unset:
    setting() gives the variable's default.)"""
    return str(value).strip().lower() not in OFF_WORDS


def _choice(*allowed: str):
    def parse(label: str, value) -> str:
        v = str(value).strip().lower()
        if v not in allowed:
            raise ConfigError(f"{label}={shown(value)} is not valid; allowed: {', '.join(allowed)}")
        return v
    return parse


def _text(label: str, value) -> str:
    return str(value)


USER, TUNING, HANDOVER, TEST = "user", "tuning", "hand-over", "test"


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    kind: str  # USER (SPEC §2 and the documented extras), TUNING (developers, tests), HANDOVER, TEST
    meaning: str
    default: object = None  # when unset or empty
    parse: Callable = _text  # (label, value) -> value; raises ConfigError naming label and the allowed values
    field: Optional[str] = None  # the Config keyword it sets


_FIELD_MEANINGS = {
    "dir": "root folder for runs",
    "name": "run name; every process of one job writes into the same run",
    "interval_ms": f"system-metric sampling interval, {INTERVAL_MIN_MS} to {INTERVAL_MAX_MS} ms",
    "gpu": "auto, off, metrics (NVML only) or trace (NVML + CUPTI activity)",
    "steps": "train steps traced in detail (ops, kernels), e.g. 10-20",
    "flush_interval_ms": "the writer's flush interval: what a killed process may lose",
    "buffer_mb": "the per-process event buffer pool",
    "pysample_hz": "Python stack samples per second (0: none)",
    "disk_floor_mb": "free space left to the job on the run's file system (MiB)",
    "disk_floor_pct": "free space left to the job on the run's file system (percent)",
}

VARIABLES = {v.name: v for v in [
    Variable("STEPSCOPE", USER, "1 turns on auto-instrumentation of every Python process (and its children)",
             False, parse_flag),
    *(Variable(var, USER, _FIELD_MEANINGS[key], getattr(Config(), key), parse, key)
      for key, (var, parse) in _FIELDS.items()),
    Variable("STEPSCOPE_OPS", TUNING, "0 turns the PyTorch op windows (torch.profiler on a few steps) off",
             True, parse_flag),
    Variable("STEPSCOPE_CLOCK", TUNING, "monotonic: CLOCK_MONOTONIC ticks even where the TSC is trusted "
             "(chosen once, at import)", "auto", _choice("auto", "monotonic")),
    Variable("STEPSCOPE_PYSAMPLE_METHOD", TUNING, "gil: the Python sampler walks frames with the GIL instead of "
             "reading them without it (each session's start)", "auto", _choice("auto", "frames", "gil")),
    Variable("STEPSCOPE_PYSAMPLE_RT", TUNING, "0: the frame reader's thread keeps its normal priority "
             "(each session's start)", True, parse_flag),
    Variable("STEPSCOPE_PROC_ROOT", TUNING, "a folder standing in for /proc, for tests (each session's start)",
             ""),
    Variable("STEPSCOPE_ACTIVE_RUN", HANDOVER, "the run folder a parent records: its children join it"),
    Variable("STEPSCOPE_ACTIVE_OWNER", HANDOVER, "the process token of the process recording the active run"),
    Variable("STEPSCOPE_PARENT_PROCESS", HANDOVER, "the parent's process folder: a spawned helper's owner"),
    Variable("STEPSCOPE_PARENT_RANK", HANDOVER, "the parent's rank: a child of another rank is a rank itself"),
    Variable("STEPSCOPE_WATCH_RUN", HANDOVER, "`stepscope watch --exec`: the run a finding is about"),
    Variable("STEPSCOPE_FINDING_RULE", HANDOVER, "`stepscope watch --exec`: the rule of the finding"),
    Variable("STEPSCOPE_CHROMIUM", TEST, "tests/test_report_browser.py: the browser to drive", "/usr/bin/chromium"),
    Variable("STEPSCOPE_REQUIRE_BROWSER", TEST, "1: the browser tests fail rather than skip without one"),
    Variable("STEPSCOPE_REQUIRE_SPARK", TEST, "1: the Spark tests fail rather than skip without Spark"),
]}


def setting(name: str, env: Optional[Mapping[str, str]] = None):
    """The parsed value of a registered variable, its default when unset or empty.

    Raises ConfigError (naming the variable and the allowed values) for a bad value,
    KeyError for a name the registry does not know."""
    var = VARIABLES[name]
    raw = (os.environ if env is None else env).get(name)
    if raw is None or not str(raw).strip():
        return var.default
    return (var.parse if var.parse is parse_flag else _checked_text(var.parse))(name, raw)


def flag(name: str, env: Optional[Mapping[str, str]] = None) -> bool:
    """A boolean variable: ``flag("STEPSCOPE_OPS")``."""
    return bool(setting(name, env))


_warned: set = set()


def _lenient(name: str, env: Optional[Mapping[str, str]]):
    """setting(), for what is read where an error would stop the job: a bad value
    is one stderr line (once) and the default."""
    try:
        return setting(name, env)
    except ConfigError as exc:
        if str(exc) not in _warned:
            _warned.add(str(exc))
            try:
                sys.stderr.write(f"stepscope: {exc}; using {VARIABLES[name].default!r}\n")
            except Exception:  # noqa: BLE001 - a closed stderr
                pass
        return VARIABLES[name].default


def native_settings(env: Optional[Mapping[str, str]] = None, clock: bool = True) -> dict:
    """Keywords for ``_native.configure``: the native core reads no environment.

    Called right after the native module's import (the clock is chosen then, once)
    and at each session's start with clock=False (the samplers read theirs at each
    start). Never raises."""
    out = {"pysample_method": "gil" if _lenient("STEPSCOPE_PYSAMPLE_METHOD", env) == "gil" else "auto",
           "pysample_rt": bool(_lenient("STEPSCOPE_PYSAMPLE_RT", env)),
           "proc_root": _lenient("STEPSCOPE_PROC_ROOT", env)}
    if clock:
        out["clock"] = _lenient("STEPSCOPE_CLOCK", env)
    return out
