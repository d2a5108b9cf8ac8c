"""Which store a run is read through: its Parquet dataset when one is cached or the run
is large, else memory. Both have one interface (``Run`` calls nothing else):

``procs`` (the processes' traces, metadata and counts), ``root`` (the dataset's folder,
None in memory), ``from_cache``, ``large``, ``has(table)``, ``table(name)``,
``select(...)``, ``select_phases(names, modes, steps, columns)``, ``gpu_select(table,
during, columns)`` (None: filter the whole table),
``event_names()``, ``ranks_with_events()``, ``extents()``, ``rows(table)`` (None: count
the built table), ``py_raw()``, ``sql_views(con)``, ``link_tables(out_dir)``.
"""

from __future__ import annotations

import os
from typing import Optional, Union

from stepscope.analysis.store.dataset_store import DatasetStore
from stepscope.analysis.store.memory import MemoryStore
from stepscope.analysis.store.schema import CACHE_VERSION
from stepscope.core.vocabulary import TRACE_FILE

Store = Union[MemoryStore, DatasetStore]


def trace_files(path: str) -> dict:
    """{process folder: [size, mtime_ns]} of every trace: what a cache is keyed on."""
    out = {}
    for d in sorted(os.listdir(path)):
        trace = os.path.join(path, d, TRACE_FILE)
        if os.path.isfile(trace):
            st = os.stat(trace)
            out[d] = [st.st_size, st.st_mtime_ns]
    return out


def open_store(path: str, cache: bool = True, dataset: Optional[bool] = None) -> Store:
    """The run's store (``dataset``: read through the dataset; None: when the run is large)."""
    manifest = {"version": CACHE_VERSION, "traces": trace_files(path)}
    store = DatasetStore.open(path, manifest, cache, dataset)
    if store is not None and store.procs:
        return store
    return MemoryStore(path, manifest, cache)
