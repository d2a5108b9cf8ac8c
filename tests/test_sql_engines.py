"""The core aggregations (analysis/export/sql.py) run unchanged on DuckDB and on Spark SQL
over a run's Parquet dataset, with equal results, and agree with the summary.

Spark runs in local mode on Java (tests/setup_java.sh installs Debian's
openjdk-17-jre-headless where it can); without Java or PySpark the Spark test
skips, unless CI=true or STEPSCOPE_REQUIRE_SPARK=1, where it fails."""

import importlib.util
import os
import shutil

import numpy as np
import pandas as pd
import pytest

import stepscope
from stepscope.analysis.export import sql
from stepscope.analysis.report.summary import summarize


@pytest.fixture(scope="module")
def gpu_dataset(tmp_path_factory):
    """A run with steps, phases, system metrics and GPU kernels, read through its dataset."""
    from test_gpu import _synthetic_training

    os.environ["STEPSCOPE_DIR"] = str(tmp_path_factory.mktemp("runs"))
    try:
        s = stepscope.start(name="sql", gpu="off", interval_ms=20)
        _synthetic_training(steps=6, latency_ns=1_000_000)
        s.stop()
    finally:
        os.environ.pop("STEPSCOPE_DIR", None)
    run = stepscope.load(s.path, dataset=True)
    return run, run._store.root


def test_duckdb_results_are_the_summarys(gpu_dataset):
    run, root = gpu_dataset
    got = sql.run_duckdb(root)
    assert set(got) == set(sql.QUERIES)  # every table is in this run
    by_mode = got["steps_by_mode"].set_index("mode")
    steps = run.steps
    assert int(by_mode.loc["train", "steps"]) == (steps["mode"] == "train").sum() == 6
    assert int(by_mode.loc["train", "total_ns"]) == int(steps.loc[steps["mode"] == "train", "duration_ns"].sum())
    summary = summarize(run)
    train = got["train_phases_by_process"].sum(numeric_only=True)
    for phase, figure in summary["phases"].items():
        column = f"{phase.lower()}_ns"
        if column in train:
            assert round(float(train[column]) / float(train["total_ns"]), 4) == figure["share"], phase
    kernels = got["kernels_by_phase"]
    assert int(kernels["kernels"].sum()) == len(run.kernels) == 19
    assert set(kernels["phase"]) == {"Forward", "Backward", "Optimizer", "none"}
    busy = got["kernel_busy_by_device"]
    per_step = run.kernel_steps
    assert int(busy["kernels"].sum()) == int(per_step["kernels"].sum()) == 19  # no NCCL kernel here
    assert int(busy["busy_ns"].sum()) == int(per_step["busy_ns"].sum()) > 0
    assert int(busy.loc[busy["mode"] == "train", "steps"].sum()) == 6
    util = got["system_by_metric"]
    assert int(util["samples"].sum()) == len(run.system)


def _spark():
    required = os.environ.get("STEPSCOPE_REQUIRE_SPARK") == "1" or os.environ.get("CI", "").lower() in ("1", "true")
    reason = None if importlib.util.find_spec("pyspark") else "PySpark is not installed"
    if reason is None and not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        reason = "no Java runtime (tests/setup_java.sh installs one as root)"
    if reason:
        if required:
            pytest.fail(f"the Spark SQL test is required here: {reason}")
        pytest.skip(reason)
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[1]").appName("stepscope-test")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.driver.memory", "1g")
            .config("spark.sql.session.timeZone", "UTC")
            # pandas writes timestamps in nanoseconds; Spark reads them as longs
            .config("spark.sql.legacy.parquet.nanosAsLong", "true")
            .getOrCreate())


def _same(a: pd.DataFrame, b: pd.DataFrame, name: str):
    assert list(a.columns) == list(b.columns), (name, list(a.columns), list(b.columns))
    assert len(a) == len(b), name
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    for c in a.columns:
        x, y = a[c], b[c]
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
            assert np.allclose(x.to_numpy(dtype=float), y.to_numpy(dtype=float), rtol=1e-9, equal_nan=True), \
                (name, c)
        else:
            assert [None if pd.isna(v) else str(v) for v in x] == [None if pd.isna(v) else str(v) for v in y], \
                (name, c)


@pytest.mark.slow
def test_spark_sql_gives_duckdbs_results(gpu_dataset):
    _, root = gpu_dataset
    spark = _spark()
    try:
        for table in sql.QUERY_TABLES:
            spark.read.parquet(os.path.join(root, table)).createOrReplaceTempView(table)
        duck = sql.run_duckdb(root)
        for name, query in sql.QUERIES.items():
            _same(duck[name], spark.sql(query).toPandas(), name)
    finally:
        spark.stop()
