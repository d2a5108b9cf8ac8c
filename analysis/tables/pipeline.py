"""tf.data pipeline stages, from the Keras integration's profiler windows: tf.data's own
per-iterator spans (framework spans named by the iterator's path, written per
thread; integrations/keras/_window.py), as plain functions over the run's events."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.tables import stepping

TFDATA_PREFIX = "Iterator::"  # the Keras windows' tf.data spans (integrations/keras/_window.py)


def tfdata_stages(run) -> pd.DataFrame:
    """Per process and tf.data pipeline stage (iterator path), over the sampled profiler
    windows: calls, self time (the stage's own work or wait, without the stages
    nested in it), total time, self ms per call; slowest stage first."""
    cols = ["process", "stage", "path", "calls", "self_ms", "total_ms", "self_ms_per_call"]
    names = run.event_names(containing=TFDATA_PREFIX)
    if not names:
        return pd.DataFrame(columns=cols)
    ev = run.select(categories=["framework"], kinds=["span"], names=names,
                    columns=["process", "tid", "name", "start_ns", "end_ns"])
    if ev.empty:
        return pd.DataFrame(columns=cols)
    process = ev["process"].astype(str).to_numpy()
    thread = pd.factorize(pd.Series(process) + ":" + ev["tid"].astype(str).to_numpy())[0]
    start, end = ev["start_ns"].to_numpy(np.int64), ev["end_ns"].to_numpy(np.int64)
    frame = pd.DataFrame({"process": process, "path": ev["name"].astype(str).to_numpy(),
                          "self": stepping.exclusive_durations(start, end, thread), "total": end - start})
    out = frame.groupby(["process", "path"], sort=False).agg(calls=("self", "size"), self_ms=("self", "sum"),
                                                              total_ms=("total", "sum")).reset_index()
    out[["self_ms", "total_ms"]] = out[["self_ms", "total_ms"]] / 1e6
    out["self_ms_per_call"] = out["self_ms"] / out["calls"]
    out["stage"] = [p.rsplit("::", 1)[-1] for p in out["path"]]
    return out.sort_values(["process", "self_ms"], ascending=[True, False], kind="stable")[cols].reset_index(drop=True)
