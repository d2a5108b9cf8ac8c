"""DataFrame helpers the stores and the table builders share."""

from __future__ import annotations

from typing import List

import pandas as pd


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

