"""DataFrame helpers the stores and the table builders share."""

from __future__ import annotations

from typing import Dict, List, Optional, Union

import numpy as np
import pandas as pd


def as_strings(column: pd.Series) -> np.ndarray:
    """``column.astype(str).to_numpy()`` (an object array of str), where a categorical's
    categories are each converted once: pandas converts row by row, seconds on millions of
    steps. Missing values read "nan", as astype(str) gives them."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column.astype(str).to_numpy(dtype=object)
    texts = np.array([str(c) for c in column.cat.categories] + ["nan"], dtype=object)
    return texts[column.cat.codes.to_numpy()]  # (code -1, missing, takes the last: "nan")


def without_unused(values: pd.Categorical) -> pd.Categorical:
    """A categorical with only the categories its values use, in their order (as
    ``remove_unused_categories``, by a bincount of the codes rather than a sort of them:
    seconds on tens of millions of rows; a trace's name table holds every name it interned)."""
    values = pd.Categorical(values)
    codes = np.asarray(values.codes, dtype=np.int64)
    used = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(values.categories)))
    if len(used) == len(values.categories):
        return values
    remap = np.full(len(values.categories) + 1, -1, dtype=np.int64)  # (a code of -1 stays -1)
    remap[used] = np.arange(len(used))
    return pd.Categorical.from_codes(remap[codes], values.categories[used], ordered=values.ordered)


def split(frame: pd.DataFrame, by: str, columns: Optional[list] = None, sort: bool = False) -> list:
    """``[(key, group), ...]`` of ``frame.groupby(by, observed=True, sort=sort)`` (missing keys
    left out; ``columns``: only these of each group), from one stable sort of the key's codes.
    Pandas' own split of a long table (millions of steps) spends most of its time finding
    its groups; a table of one group (one mode, one process) is given whole, not copied,
    and a table whose groups come one after another (the steps, process by process) in slices."""
    key = pd.Categorical(frame[by])
    codes = np.asarray(key.codes)
    part = frame.iloc[:] if columns is None else frame[columns]  # (a new frame: a group's changes stay its own)
    present = codes[0] if len(codes) else -1
    if present >= 0 and not np.any(codes != present):
        return [(key.categories[present], part)]
    runs = _runs(codes, sort)
    if runs is not None:
        return [(key.categories[codes[a]], part.iloc[a:b]) for a, b in runs]
    order = np.argsort(codes, kind="stable")
    groups = [rows for rows in np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
              if len(rows) and codes[rows[0]] >= 0]
    if not sort:  # in the order they first appear (each group's rows are in table order)
        groups.sort(key=lambda rows: rows[0])
    return [(key.categories[codes[rows[0]]], part.iloc[rows]) for rows in groups]


# A slice of a frame is a view: safe to hand out as a group only where pandas copies on
# write (3.0 on; before it, a group's changes could reach the table)
_SLICES_ARE_SAFE = int(pd.__version__.split(".")[0]) >= 3 or pd.get_option("mode.copy_on_write") is True


def _runs(codes: np.ndarray, sort: bool) -> Optional[List[tuple]]:
    """[(first row, end row)] of each group where every group's rows are one run (each key
    once, no missing key): in key order (``sort``) or in the table's; None otherwise."""
    if not _SLICES_ARE_SAFE or not len(codes) or codes.min() < 0:
        return None
    ends = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    firsts = codes[np.concatenate(([0], ends))]
    if len(np.unique(firsts)) != len(firsts):
        return None
    bounds = [0, *ends.tolist(), len(codes)]
    runs = list(zip(bounds[:-1], bounds[1:]))
    return [runs[i] for i in np.argsort(firsts, kind="stable")] if sort else runs


def groups(frame: pd.DataFrame, keys: List[str], columns: Optional[list] = None) -> list:
    """``list(frame.groupby(keys, dropna=False, sort=True, observed=True))`` (``columns``: only
    these of each group), keys and groups alike. Where the first key is a categorical whose
    groups come one after another (the steps, process by process), each of them is split
    on its own, and one in which the other keys do not vary is given whole (a slice, no
    copy): a run's millions of steps are otherwise copied group by group on every split."""
    part = frame if columns is None else frame[columns]
    first = frame[keys[0]] if len(frame) else None
    runs = _runs(np.asarray(first.cat.codes), True) \
        if first is not None and isinstance(first.dtype, pd.CategoricalDtype) else None
    if runs is None:
        return list(part.groupby(keys if columns is None else [frame[k] for k in keys],
                                 dropna=False, sort=True, observed=True))
    out = []
    for a, b in runs:
        whole, rows = frame.iloc[a:b], part.iloc[a:b]
        if all(_constant(whole[k]) for k in keys[1:]):
            key = next(iter(whole.iloc[:1].groupby(keys, dropna=False, sort=True, observed=True)))[0]
            out.append((key, rows))
        else:
            out.extend(whole.groupby(keys, dropna=False, sort=True, observed=True) if columns is None else
                       rows.groupby([whole[k] for k in keys], dropna=False, sort=True, observed=True))
    return out


def _constant(column: pd.Series) -> bool:
    """Whether every value of the column is the same (all missing counts as the same)."""
    missing = column.isna().to_numpy()
    if missing.all():
        return True
    if missing.any():
        return False
    values = column.cat.codes.to_numpy() if isinstance(column.dtype, pd.CategoricalDtype) else column.to_numpy()
    return bool((values == values[0]).all())


def concat(parts: List[pd.DataFrame]) -> pd.DataFrame:
    """Concatenates, keeping categorical columns categorical (categories in order of
    appearance, process by process, as the in-memory tables have them)."""
    from pandas.api.types import union_categoricals

    cats = {c for part in parts for c in part.columns if isinstance(part[c].dtype, pd.CategoricalDtype)}
    frame = pd.concat(parts, ignore_index=True)
    for c in cats:
        if not isinstance(frame[c].dtype, pd.CategoricalDtype):
            frame[c] = union_categoricals([pd.Categorical(part[c]) for part in parts], ignore_order=True)
    return frame


def columns_of(frame: pd.DataFrame, rows: np.ndarray) -> Dict[str, object]:
    """A frame's columns of the rows ``rows`` (a boolean mask or positions) as separate
    arrays, each its own memory: ``concat_in_order`` frees each part's column as soon as
    it is joined (a frame's columns may share a block, freed only all together)."""
    return {c: (frame[c].to_numpy() if isinstance(frame[c].dtype, np.dtype) else frame[c].array)[rows]
            for c in frame.columns}


def concat_in_order(parts: List[Union[pd.DataFrame, Dict[str, object]]], order_of) -> pd.DataFrame:
    """``concat(parts)`` with its rows in ``order_of(start_ns, end_ns)``'s order, built a
    column at a time. Parts given as ``columns_of`` dicts are emptied as it goes (each
    column is let go once joined): the peak is the parts and one joined column, not the
    parts and their concatenation."""
    from pandas.api.types import union_categoricals

    column = lambda p, c: p[c].array if isinstance(p, pd.DataFrame) else p[c]  # noqa: E731
    names = list(parts[0].columns if isinstance(parts[0], pd.DataFrame) else parts[0])
    starts = np.concatenate([np.asarray(column(p, "start_ns")) for p in parts])
    order = order_of(starts, np.concatenate([np.asarray(column(p, "end_ns")) for p in parts]))
    del starts
    # Parts decoded one after the other are each in order and overlap only near their
    # edges (a span is written when it ends): only the rows out of place are moved.
    moved = np.flatnonzero(order != np.arange(len(order)))
    source = order[moved]
    del order
    out = {}
    for c in names:
        pieces = [p.pop(c) if isinstance(p, dict) else column(p, c) for p in parts]
        dtype = pieces[0].dtype
        if isinstance(dtype, pd.CategoricalDtype):
            joined = union_categoricals(pieces, ignore_order=True)
            codes = np.array(joined.codes)  # (writable)
            codes[moved] = codes[source]  # (the right side is gathered before it is written)
            joined = pd.Categorical.from_codes(codes, dtype=joined.dtype)
        elif isinstance(dtype, np.dtype) or isinstance(pieces[0], pd.arrays.NumpyExtensionArray):
            joined = np.concatenate([np.asarray(v) for v in pieces])
            joined[moved] = joined[source]
        else:  # (nullable integers)
            joined = type(pieces[0])._concat_same_type(pieces)
            if len(moved):
                whole = np.arange(len(joined))
                whole[moved] = source
                joined = joined.take(whole)
        del pieces
        out[c] = joined
        del joined
    return pd.DataFrame(out, copy=False)
