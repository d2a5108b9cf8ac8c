"""Which store a run is read through: its Parquet dataset when one is cached or the run
is large, else memory. Both build the tables of the ``Catalog`` they are given and
have one interface, ``Store`` (``Run`` calls nothing else).
"""

from __future__ import annotations

import os
from typing import Optional, Protocol

import pandas as pd

from stepscope.analysis.store.dataset_store import DatasetStore
from stepscope.analysis.store.memory import MemoryStore
from stepscope.analysis.store.recipe import Catalog
from stepscope.analysis.store.schema import CACHE_VERSION
from stepscope.core.vocabulary import TRACE_FILE


class Store(Protocol):
    """What ``Run`` reads a run through (``MemoryStore``, ``DatasetStore``)."""

    procs: list  # the processes' traces: metadata, counts, warnings
    root: Optional[str]  # the dataset's folder; None in memory
    from_cache: bool

    @property
    def large(self) -> bool:
        """Too many events to hold at once: analysis reads selections."""

    def has(self, name: str) -> bool:
        """Whether the table is built (or read) already."""

    def table(self, name: str) -> pd.DataFrame:
        """The events or a catalog table, built on first use."""

    def select(self, categories=None, kinds=None, names=None, processes=None, columns=None,
               during=None) -> pd.DataFrame:
        """Events matching every given list (``Run.select``)."""

    def select_phases(self, names=None, modes=None, steps=None, columns=None) -> pd.DataFrame:
        """Phases of these names, modes and steps (``Run.select_phases``)."""

    def gpu_select(self, table: str, during=None, columns=None) -> pd.DataFrame:
        """A GPU table's rows overlapping ``during`` (``Run.gpu_select``)."""

    def event_names(self) -> list:
        """Every name events carry."""

    def ranks_with_events(self) -> int:
        """Ranks that recorded events (1 without ranks)."""

    def extents(self) -> pd.DataFrame:
        """Per process: first start, last end, events, those the job recorded."""

    def rows(self, name: str) -> int:
        """Rows of a table, counted without building it where the store can."""

    def py_raw(self) -> tuple:
        """(raw samples, stacks) of the whole run."""

    def sql_views(self, con) -> set:
        """Tables registered in DuckDB as views over files (the others: from pandas)."""

    def link_tables(self, out_dir: str) -> set:
        """Tables written to ``out_dir`` as files linked from the store's (the others: written whole)."""


def trace_files(path: str) -> dict:
    """{process folder: [size, mtime_ns]} of every trace: what a cache is keyed on."""
    out = {}
    for d in sorted(os.listdir(path)):
        trace = os.path.join(path, d, TRACE_FILE)
        if os.path.isfile(trace):
            st = os.stat(trace)
            out[d] = [st.st_size, st.st_mtime_ns]
    return out


def open_store(path: str, catalog: Catalog, cache: bool = True, dataset: Optional[bool] = None) -> Store:
    """The run's store, building ``catalog``'s tables (``dataset``: read through the
    dataset; None: when the run is large)."""
    manifest = {"version": CACHE_VERSION, "tables": catalog.key(), "traces": trace_files(path)}
    store = DatasetStore.open(path, manifest, cache, dataset, catalog)
    if store is not None and store.procs:
        return store
    return MemoryStore(path, manifest, cache, catalog)
