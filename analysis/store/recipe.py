"""How the run's tables are made, declared once: ``Table`` (a table's columns, dtypes and
what it holds) and ``Recipe`` (how one pass builds one or more tables from the run's
sources or other tables). The stores build every table from a ``Catalog`` of recipes
they are given (``analysis/tables/catalog.py`` declares the built-in ones, plugins add
theirs): nothing in ``store/`` knows how a table is computed (docs/design.md, "Tables").

Sources are what a store decodes itself: ``events`` (the decoded trace, one row per
event) and ``gpu_raw`` (the GPU records as recorded). A recipe's ``build`` is called
with one keyword argument per input and returns {table: DataFrame} for each of its
tables. Every table is derived from one process's trace alone (steps belong to a
process's threads, GPU records to the process that saw them): the Parquet dataset
builds each process's partition from that process's sources, and the in-memory
store builds the tables of the whole run at once; both give the same rows.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Mapping, Optional, Tuple

import pandas as pd

SOURCES = ("events", "gpu_raw")  # what the stores decode; every other input is a table


@dataclass(frozen=True)
class Table:
    """A table: its name (``Run.<name>``, the dataset's folder, the SQL name), its
    columns in order with their dtypes, and one line on what a row is."""

    name: str
    columns: Mapping[str, str]
    description: str
    sort_by: str = "start_ns"  # the rows' order within a process (the dataset's files)
    partition_by: str = "process"  # the dataset's Hive partition key
    few_rows: bool = False  # a few rows a step: the dataset gathers a part-wise table's parts into 1 M-row files


@dataclass(frozen=True)
class Recipe:
    """One pass building ``tables`` from ``inputs`` (source or table names, each a keyword
    argument of ``build``).

    ``by_part``: built a part of ``gpu_raw`` at a time by the dataset (a GPU trace is
    mostly kernels: hundreds of MB a process); ``build`` then also takes ``shared``
    (what ``prepare(**non-source inputs)`` made once per process) and ``nearby`` (the
    launch keys of the neighbouring parts). ``combine``: for a recipe over tables that
    are built by part, how the results of each part make the process's (the dataset
    builds it per part; the in-memory store builds it once). ``consumes``: ``build``
    takes ``consume=True`` where its caller gives the events up (their columns go as
    they are read). ``event_categories``, ``event_names`` (prefixes): of a trace decoded
    in parts, the dataset keeps for the derived tables only the events they read."""

    tables: Tuple[Table, ...]
    inputs: Tuple[str, ...]
    build: Callable[..., Dict[str, pd.DataFrame]]
    by_part: bool = False
    prepare: Optional[Callable[..., object]] = None
    combine: Optional[Callable[[list], Dict[str, pd.DataFrame]]] = None
    consumes: bool = False
    event_categories: Tuple[str, ...] = ()
    event_names: Tuple[str, ...] = ()  # (name prefixes)

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(t.name for t in self.tables)


@dataclass(frozen=True, eq=False)
class Catalog:
    """The recipes of a run's tables, in an order where each recipe's inputs come before it."""

    recipes: Tuple[Recipe, ...]
    _by_table: Dict[str, Recipe] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        by_table = {}
        for r in self.recipes:
            for name in r.names:
                if name in by_table or name in SOURCES:
                    raise ValueError(f"table {name!r} is declared twice")
                by_table[name] = r
            missing = [i for i in r.inputs if i not in by_table and i not in SOURCES]
            if missing:
                raise ValueError(f"{'/'.join(r.names)} is built from {missing}, which no recipe before it makes")
            if r.by_part != ("gpu_raw" in r.inputs):
                raise ValueError(f"{'/'.join(r.names)}: a recipe over gpu_raw, and only one, is built by part")
        object.__setattr__(self, "_by_table", by_table)
        self.dataset_stages()  # (raises for a recipe the dataset cannot build)

    def with_recipes(self, extra: Iterable[Recipe]) -> "Catalog":
        return Catalog(self.recipes + tuple(extra))

    @property
    def names(self) -> Tuple[str, ...]:
        """Every table, sources' first (``events``), in recipe order."""
        return ("events", *self._by_table)

    def tables(self) -> Dict[str, Table]:
        return {t.name: t for r in self.recipes for t in r.tables}

    def recipe_of(self, table: str) -> Recipe:
        try:
            return self._by_table[table]
        except KeyError:
            raise KeyError(table) from None

    def dataset_stages(self) -> Tuple[list, list, list]:
        """(before, per_part, after): the order the dataset builds a process's tables in.
        ``per_part``: the recipes over ``gpu_raw`` (each part's tables written as they
        come) and those that ``combine`` per-part results of their tables; ``before``:
        the recipes that read none of these, built first (the part-wise ones read them);
        ``after``: the rest, from whole tables (a part-wise table read back from the
        process's files)."""
        part_tables, late = set(), set()
        before, per_part, after = [], [], []
        for r in self.recipes:
            reads = set(r.inputs)
            if r.by_part:
                if reads & late:
                    raise ValueError(f"{'/'.join(r.names)} is built by part from tables built after the parts")
                per_part.append(r)
                part_tables.update(r.names)
            elif r.combine is not None and reads & part_tables and not reads & late:
                per_part.append(r)
                late.update(r.names)
            elif reads & (part_tables | late):
                after.append(r)
                late.update(r.names)
            else:
                before.append(r)
        return before, per_part, after

    def part_tables(self) -> Tuple[str, ...]:
        """The tables the dataset writes a part at a time."""
        return tuple(n for r in self.recipes if r.by_part for n in r.names)

    def event_rows(self) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        """(categories, name prefixes) of the events some recipe reads."""
        return (tuple(sorted({c for r in self.recipes for c in r.event_categories})),
                tuple(sorted({n for r in self.recipes for n in r.event_names})))

    @functools.cached_property
    def empty(self) -> Dict[str, pd.DataFrame]:
        """Each table with no rows, as its recipe builds it from empty sources (same columns,
        dtypes as plain as empty inputs give): what a table no process has rows of reads as."""
        from stepscope.analysis.store import gpu_raw, reader

        return self.build_all({"events": reader.empty_events(), "gpu_raw": gpu_raw.empty_raw()})

    def key(self) -> str:
        """What a cached dataset was built for: every table's name and columns."""
        spec = [[t.name, list(t.columns.items())] for r in self.recipes for t in r.tables]
        return hashlib.sha1(json.dumps(spec).encode()).hexdigest()[:12]

    def build_all(self, sources: Dict[str, object]) -> Dict[str, pd.DataFrame]:
        """Every table from these sources, one recipe after the other (the in-memory way)."""
        out = dict(sources)
        for r in self.recipes:
            out.update(built(r, {i: out[i] for i in r.inputs}))
        return {name: out[name] for name in self.names}


def built(recipe: Recipe, inputs: dict, **options) -> Dict[str, pd.DataFrame]:
    """``recipe.build(**inputs)``, checked: a recipe gives exactly its tables, each with
    its declared columns in order (a plugin's mistake is named, not found later)."""
    return checked(recipe, recipe.build(**inputs, **options))


def checked(recipe: Recipe, out) -> Dict[str, pd.DataFrame]:
    """A recipe's result held to its declaration: exactly its tables, each with its declared
    columns in order (a plugin's mistake is named, not found later)."""
    if not isinstance(out, dict) or set(out) != set(recipe.names):
        got = sorted(out) if isinstance(out, dict) else type(out).__name__
        raise TypeError(f"the recipe of {'/'.join(recipe.names)} returned {got}")
    for t in recipe.tables:
        frame = out[t.name]
        if list(frame.columns) != list(t.columns):
            raise TypeError(f"table {t.name}: built with columns {list(frame.columns)}, declared {list(t.columns)}")
    return out
