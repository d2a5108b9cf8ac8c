"""Metadata files (run.json, process.json, a trace's header, a dataset manifest) checked
field by field against the shapes the readers rely on.

A small validator of our own rather than jsonschema: jsonschema stays a test-only
dependency (nothing more to install for users), and reading needs less than JSON Schema
offers: keep every field of the right shape, drop each other one with a line naming the
file and the field, so the rest of the run is still read.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Dict, List, Optional, Tuple


class Field:
    """A check on one value and the words for what it expects."""

    def __init__(self, check: Callable[[object], bool], expected: str):
        self.check, self.expected = check, expected

    def __call__(self, value) -> bool:
        return self.check(value)


def integer(bits: int) -> Field:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return Field(lambda v: type(v) is int and lo <= v <= hi, f"an integer of {bits} bits")


def optional(f: Field) -> Field:
    return Field(lambda v: v is None or f(v), f"null or {f.expected}")


def fields(shape: Dict[str, Field], expected: str) -> Field:
    """An object whose listed fields, where present, have their shapes."""
    return Field(lambda v: isinstance(v, dict) and not problems(v, shape), expected)


def list_of(f: Field) -> Field:
    return Field(lambda v: isinstance(v, list) and all(f(x) for x in v), f"a list of {f.expected}s")


INT32, INT64 = integer(32), integer(64)
NUMBER = Field(lambda v: type(v) in (int, float) and math.isfinite(v), "a finite number")
TEXT = Field(lambda v: isinstance(v, str), "a string")
FLAG = Field(lambda v: isinstance(v, bool), "true or false")
OBJECT = Field(lambda v: isinstance(v, dict), "an object")
LIST = Field(lambda v: isinstance(v, list), "a list")
# A file beside process.json: a name, never a path (a device or a FIFO would hang the reader)
FILE_NAME = Field(lambda v: isinstance(v, str) and v == os.path.basename(v) and v not in ("", ".", ".."),
                  "a file name in the process folder")

CLOCK = fields({"realtime_ns": INT64, "monotonic_ns": INT64, "uncertainty_ns": optional(NUMBER),
                "source": TEXT, "ticks_per_ns": NUMBER}, "a clock anchor (realtime_ns, monotonic_ns: integers)")

# process.json and a trace's header (docs/format.md, core/session.py)
PROCESS_FIELDS = {
    "pid": INT32, "ppid": optional(INT32), "host": TEXT, "rank": optional(INT32), "parent_rank": optional(INT32),
    "local_rank": optional(INT32), "world_size": optional(INT32), "origin": optional(TEXT),
    "parent": optional(Field(lambda v: type(v) in (str, int), "a string or an integer")),
    "argv": list_of(TEXT), "start_time": optional(NUMBER), "process_start_time": optional(NUMBER),
    "end_time": optional(NUMBER), "clock": CLOCK, "clock_correction_ns": optional(INT64), "trace": FILE_NAME,
    "threads": OBJECT, "stats": OBJECT, "versions": OBJECT,
}

RUN_FIELDS = {
    "format": TEXT, "version": INT32, "name": TEXT, "command": list_of(TEXT), "cwd": TEXT,
    "start_time": optional(NUMBER), "end_time": optional(NUMBER), "duration_s": optional(NUMBER), "host": TEXT,
    "hosts": list_of(TEXT), "ranks": list_of(INT32), "world_size": optional(INT32), "config": OBJECT,
    "versions": OBJECT, "notes": list_of(TEXT), "clock_alignment": OBJECT, "merged_from": LIST,
}

# One process of a Parquet dataset's manifest.json (analysis/store/dataset_build.py): all required.
MANIFEST_ENTRY_FIELDS = {
    "folder": TEXT, "partition": TEXT, "meta": fields(PROCESS_FIELDS, "process metadata"),
    "warnings": list_of(TEXT), "events": INT64, "dropped": INT64, "readable": FLAG, "clean_close": FLAG,
    "rows": OBJECT,
}
MANIFEST_OPTIONAL_FIELDS = {
    "lost_samples": INT64, "names": LIST, "spans": OBJECT,
    "extent": fields({"start_ns": INT64, "end_ns": INT64}, "an extent"),
}


def problems(data: dict, shape: Dict[str, Field]) -> List[Tuple[str, str]]:
    """(field, what it should be) for each present field of the wrong shape."""
    return [(k, f.expected) for k, f in shape.items() if k in data and not f(data[k])]


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def conform(data, shape: Dict[str, Field], path: str) -> Tuple[dict, List[str]]:
    """``data`` without its fields of the wrong shape, and one line per field dropped."""
    if not isinstance(data, dict):
        return {}, [f"{path}: not a JSON object ({_shown(data)}); its metadata is ignored"]
    bad = problems(data, shape)
    notes = [f"{path}: field {k!r} should be {expected}, not {_shown(data[k])}; ignored" for k, expected in bad]
    return {k: v for k, v in data.items() if k not in dict(bad)}, notes


def read(path: str, shape: Dict[str, Field]) -> Tuple[dict, List[str]]:
    """A metadata file conformed to ``shape``; a missing file is {} without a note."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8", errors="replace"))
    except FileNotFoundError:
        return {}, []
    except (OSError, ValueError, RecursionError) as exc:
        return {}, [f"{path}: unreadable ({exc}); its metadata is ignored"]
    return conform(data, shape, path)


def manifest_entries(saved, required: Dict[str, Field] = MANIFEST_ENTRY_FIELDS) -> Optional[list]:
    """A cache manifest's process entries, or None when any is not as written (a key
    missing, a wrong shape): the cache is then built again."""
    entries = saved.get("processes") if isinstance(saved, dict) else None
    if not isinstance(entries, list):
        return None
    for e in entries:
        if not isinstance(e, dict) or any(k not in e for k in required) \
                or problems(e, required) or problems(e, MANIFEST_OPTIONAL_FIELDS):
            return None
    return entries
