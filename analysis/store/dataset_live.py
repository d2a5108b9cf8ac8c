"""A trace still being written: the parts of it that will not change any more, kept
between builds of its dataset so that the next build decodes only what is new."""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.dataset_files import write_file
from stepscope.core.vocabulary import PROCESS_JSON, TRACE_FILE

# of the parts kept between builds of a trace still being written (2: GPU records decoded again; 3: loop marks
# kept; 4: compiling's spans kept, the steps' compile_ns)
LIVE_VERSION = 4


def derived_rows(events: pd.DataFrame, categories, name_prefixes) -> np.ndarray:
    """The events the derived tables are built from: those of the categories and names
    their recipes read (``Catalog.event_rows``), and the last event to end (it closes the
    last step)."""
    keep = events["category"].isin(list(categories)).to_numpy().copy()
    prefixes = tuple(name_prefixes)
    named = [n for n in events["name"].cat.categories if str(n).startswith(prefixes)] if prefixes else []
    if named:
        keep |= events["name"].isin(named).to_numpy()
    if len(events):
        keep[int(events["end_ns"].to_numpy().argmax())] = True
    return keep


def trace_identity(folder: str, part_bytes: int) -> Optional[list]:
    try:
        st = os.stat(os.path.join(folder, TRACE_FILE))
    except OSError:
        return None
    return [st.st_dev, st.st_ino, part_bytes]  # kept parts are of one part size


def ended(folder: str) -> bool:
    """The process stopped profiling (process.json has its end time): its trace is final."""
    try:
        with open(os.path.join(folder, PROCESS_JSON)) as f:
            return json.load(f).get("end_time") is not None
    except (OSError, ValueError, AttributeError):
        return False


def keep_part(where: str, part: dict, events: pd.DataFrame, identity: list, rows) -> None:
    """Keeps a finished part: its events file and the events the derived tables need
    (``rows``: ``Catalog.event_rows``, part of ``identity``; its GPU records are decoded
    again: cheaper than keeping them); the JSON, written last, makes it usable."""
    keep = derived_rows(events, *rows)
    write_file(events, f"{where}.events.parquet")
    tmp = f"{where}.kept.parquet.tmp{os.getpid()}"  # (another load of the run may be reading it)
    events[keep].to_parquet(tmp, index=False)  # every column, as decoded
    os.replace(tmp, f"{where}.kept.parquet")
    info = dict(part, identity=identity, version=LIVE_VERSION, events_file=f"{where}.events.parquet")
    with open(f"{where}.json.tmp{os.getpid()}", "w") as f:
        json.dump(info, f)
    os.replace(f"{where}.json.tmp{os.getpid()}", f"{where}.json")


def reused_part(live: str, i: int, identity: list):
    """(part info, events) of a part kept by an earlier build of the same trace, or None.
    The events are those kept for the derived tables (the full part is linked)."""
    where = os.path.join(live, f"part-{i:05d}")
    try:
        with open(f"{where}.json") as f:
            part = json.load(f)
        if part.get("identity") != identity or part.get("version") != LIVE_VERSION:
            return None
        return part, pd.read_parquet(f"{where}.kept.parquet")
    except (OSError, ValueError):
        return None

