"""The summary's and the rules' core aggregations as portable SQL, over the run's
Parquet dataset (docs/format.md): the same text runs unchanged on DuckDB and on
Spark SQL (tests/test_sql_engines.py checks both give the same results), so a
run too large for one machine is summarised where the data lives.

Each query reads the tables by name (``QUERY_TABLES``): register them as views over ``<dataset>/<table>`` first
(``duckdb_views`` here; in Spark, ``spark.read.parquet(path).createOrReplaceTempView(table)``).
Only plain SQL: GROUP BY, SUM/COUNT/MIN/MAX/AVG, CASE; no dialect's percentile
or window functions, so results agree exactly across engines.
"""

from __future__ import annotations

from typing import Dict

import pandas as pd

from stepscope.analysis.store import dataset_read
from stepscope.analysis.quantities import OTHER, TRAIN, phase_sums_sql, phase_total_column

QUERY_TABLES = ("steps", "phases", "kernels", "kernel_steps", "system")  # the dataset tables the queries read
_PHASE_SUMS = phase_sums_sql()
_OTHER_SUM = f"SUM({OTHER}) AS {phase_total_column(OTHER)}"

QUERIES: Dict[str, str] = {
    # The summary's step statistics per mode (count, total, mean, extremes).
    "steps_by_mode": """
        SELECT mode, COUNT(*) AS steps, SUM(duration_ns) AS total_ns, MIN(duration_ns) AS min_ns,
               MAX(duration_ns) AS max_ns, """ + _OTHER_SUM + ", " + _PHASE_SUMS + """
        FROM steps GROUP BY mode ORDER BY mode""",
    # Phase shares of train step time (GetNextBottleneck's and the summary's figure, quantities.phase_shares'
    # sums over the train steps), per process.
    "train_phases_by_process": """
        SELECT process, COUNT(*) AS steps, SUM(duration_ns) AS total_ns, """ + _PHASE_SUMS + """
        FROM steps WHERE mode = '""" + TRAIN + """' GROUP BY process ORDER BY process""",
    # Steps per rank and mode (LoadBalancing across ranks, missing ranks).
    "steps_by_rank": """
        SELECT process, mode, COUNT(*) AS steps, MIN(start_ns) AS first_ns, MAX(end_ns) AS last_ns
        FROM steps GROUP BY process, mode ORDER BY process, mode""",
    # Phase spans: count and exclusive time per mode and phase (OverallFrameworkMetrics).
    "phase_spans": """
        SELECT mode, name, COUNT(*) AS spans, SUM(duration_ns) AS total_ns, SUM(exclusive_ns) AS exclusive_ns
        FROM phases GROUP BY mode, name ORDER BY mode, name""",
    # GPU kernel time per phase and precision (KernelLaunchBound, precision mix).
    "kernels_by_phase": """
        SELECT CASE WHEN phase IS NULL THEN 'none' ELSE phase END AS phase, precision,
               COUNT(*) AS kernels, SUM(duration_ns) AS total_ns, MAX(duration_ns) AS max_ns
        FROM kernels GROUP BY CASE WHEN phase IS NULL THEN 'none' ELSE phase END, precision
        ORDER BY phase, precision""",
    # Compute kernels per device: busy time, gaps and launch gaps (KernelLaunchBound, LoadBalancing),
    # from the kernels aggregated per step (analysis/tables/kernel_steps.py).
    "kernel_busy_by_device": """
        SELECT process, device, CASE WHEN mode IS NULL THEN 'none' ELSE mode END AS mode, COUNT(*) AS steps,
               SUM(kernels) AS kernels, SUM(kernel_ns) AS kernel_ns, SUM(busy_ns) AS busy_ns, SUM(gap_ns) AS gap_ns,
               SUM(launch_gap_ns) AS launch_gap_ns
        FROM kernel_steps GROUP BY process, device, CASE WHEN mode IS NULL THEN 'none' ELSE mode END
        ORDER BY process, device, mode""",
    # System metrics per node and metric (OverallSystemUsage, CPU/GPU utilisation rules).
    "system_by_metric": """
        SELECT node, metric, device, COUNT(*) AS samples, AVG(value) AS mean, MIN(value) AS min, MAX(value) AS max
        FROM system GROUP BY node, metric, device ORDER BY node, metric, device""",
}


def tables_of(query: str):
    """The dataset tables a query reads."""
    words = set(query.replace(",", " ").split())
    return [t for t in QUERY_TABLES if t in words]


def duckdb_views(con, root: str) -> None:
    """Views named after the tables over the dataset at ``root`` (nothing is loaded)."""
    dataset_read.duckdb_views(con, root)


def run_duckdb(root: str, names=None) -> Dict[str, pd.DataFrame]:
    """Every query (or those named) on DuckDB over the dataset at ``root``; a query
    whose tables the dataset does not have is left out."""
    import os

    import duckdb

    con = duckdb.connect()
    duckdb_views(con, root)
    out = {}
    for name, query in QUERIES.items():
        if names is not None and name not in names:
            continue
        if all(os.path.isdir(os.path.join(root, t)) for t in tables_of(query)):
            out[name] = con.execute(query).df()
    return out
