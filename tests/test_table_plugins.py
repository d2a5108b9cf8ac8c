"""A table added by a plugin (entry-point group ``stepscope.tables``: a ``Recipe``) is built
from its declaration by both stores, as the built-in tables are (analysis/store/recipe.py,
docs/design.md "Adding a table"): ``run.<name>``, ``run.table(name)``, SQL and the Parquet
export see it, in memory and through the dataset (a trace decoded in parts, the GPU
records a part at a time), with the same rows. A broken plugin table is reported once and
left out; the run's other tables are not affected."""

import os
import shutil
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

import stepscope
from stepscope.analysis.store import dataset_build, dataset_read
from stepscope.analysis.tables import catalog as catalog_module
from stepscope.core.vocabulary import CACHE_DIR

PLUGIN = textwrap.dedent('''
    import pandas as pd
    from stepscope.analysis.store.recipe import Recipe, Table


    def step_gaps(steps):
        """Per process, the time from each step's end to the next step's start."""
        rows = []
        for process, s in steps.sort_values("start_ns").groupby("process", observed=True, sort=True):
            start, end = s["start_ns"].to_numpy(), s["end_ns"].to_numpy()
            for step, gap in zip(s["step"].to_numpy()[1:], start[1:] - end[:-1]):
                rows.append((str(process), int(step), int(gap)))
        return {"step_gaps": pd.DataFrame(rows, columns=["process", "step", "gap_ns"]).astype(
            {"step": "int64", "gap_ns": "int64"})}


    def kernel_counts(kernels):
        g = kernels.groupby(kernels["process"].astype(str))["duration_ns"]
        out = pd.DataFrame({"kernels": g.size(), "kernel_ns": g.sum()}).astype("int64")
        return {"kernel_counts": out.rename_axis("process").reset_index()}


    def combine_counts(parts):
        frames = [p["kernel_counts"] for p in parts]
        if not frames:
            return {"kernel_counts": pd.DataFrame({"process": [], "kernels": [], "kernel_ns": []})}
        out = pd.concat(frames).groupby("process")[["kernels", "kernel_ns"]].sum().astype("int64")
        return {"kernel_counts": out.reset_index()}


    def phase_counts(events):
        phases = events[events["category"] == "phase"]
        g = phases.groupby(phases["process"].astype(str)).size()
        return {"phase_counts": pd.DataFrame({"process": g.index.astype(str), "phase_events": g.to_numpy()})}


    RECIPES = [
        Recipe((Table("step_gaps", {"process": "object", "step": "int64", "gap_ns": "int64"},
                      "the time between a step and the next of its process"),), ("steps",), step_gaps),
        Recipe((Table("kernel_counts", {"process": "object", "kernels": "int64", "kernel_ns": "int64"},
                      "kernels per process"),), ("kernels",), kernel_counts, combine=combine_counts),
        Recipe((Table("phase_counts", {"process": "object", "phase_events": "int64"},
                      "phase events per process"),), ("events",), phase_counts, event_categories=("phase",)),
    ]


    def wrong_columns(steps):
        return {"broken_table": pd.DataFrame({"other": []})}


    BROKEN = Recipe((Table("broken_table", {"process": "object"}, "declares columns it does not build"),),
                    ("steps",), wrong_columns)
''')


@pytest.fixture
def plugin_tables(tmp_path, monkeypatch):
    """The plugin installed (a dist-info folder on sys.path, as pip leaves it), the catalog read again."""
    site = tmp_path / "site"
    site.mkdir()
    info = site / "plugin_tables-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin_tables\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[stepscope.tables]\nours = plugin_tables:RECIPES\n"
                                           "broken = plugin_tables:BROKEN\n")
    (site / "plugin_tables.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    catalog_module.catalog.cache_clear()
    yield
    catalog_module.catalog.cache_clear()


def _gpu_run(run_dir):
    from test_gpu import _synthetic_training

    os.environ["STEPSCOPE_FLUSH_MS"] = "10"  # (the records in several chunks: a trace of several parts)
    try:
        s = stepscope.start(name="gpu", gpu="off")
    finally:
        del os.environ["STEPSCOPE_FLUSH_MS"]
    for _ in range(3):  # (a pause between: each call's GPU records in chunks of their own)
        _synthetic_training(steps=2, latency_ns=1_000_000)
        time.sleep(0.05)
    stepscope.end_step()
    s.stop()
    return s.path


def _kinds(dtypes) -> dict:
    """Dtypes, strings as one kind: pandas 3 infers ``str`` for a column of strings and keeps
    ``object`` where a value is missing (pandas 2: ``object`` always), as the schema's note says."""
    return {c: "strings" if d in ("str", "object") else d for c, d in dict(dtypes).items()}


def _sorted(frame):
    return frame.sort_values(list(frame.columns)).reset_index(drop=True).astype({"process": str})


def test_a_plugin_table_is_built_by_both_stores_alike(plugin_tables, run_dir, tmp_path, monkeypatch, capfd):
    path = _gpu_run(run_dir)
    memory = stepscope.load(path, cache=False)
    assert {"step_gaps", "kernel_counts", "phase_counts"} <= set(memory.tables)
    assert "broken_table" not in memory.tables
    err = capfd.readouterr().err
    assert err.count("broken_table") == 1 and "declared" in err  # reported once, named

    # the numbers, from the run's own tables
    steps = memory.steps.sort_values("start_ns")
    gaps = memory.step_gaps
    assert len(gaps) == len(steps) - 1 == 5 and (gaps["gap_ns"] >= 0).all()
    assert gaps["gap_ns"].sum() == int((steps["start_ns"].to_numpy()[1:] - steps["end_ns"].to_numpy()[:-1]).sum())
    counts = memory.table("kernel_counts")
    assert counts["kernels"].sum() == len(memory.kernels) >= 18  # 6 steps x 3 phases
    assert counts["kernel_ns"].sum() == memory.kernels["duration_ns"].sum()
    phases = memory.select(categories=["phase"])
    assert memory.phase_counts["phase_events"].sum() == len(phases) > 0

    # through the dataset, each trace decoded in parts of 1 KB (the GPU records a part at a time)
    monkeypatch.setattr(dataset_build, "PART_BYTES", 1024)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns(CACHE_DIR))
    through = stepscope.load(copy, dataset=True)
    root = through._store.root
    assert root is not None and os.path.isdir(os.path.join(root, "step_gaps"))
    kernels = os.path.join(root, "kernels")
    assert max(len(os.listdir(os.path.join(kernels, d))) for d in os.listdir(kernels)) >= 2  # parts
    for name in ("step_gaps", "kernel_counts", "phase_counts"):
        pd.testing.assert_frame_equal(_sorted(memory.table(name)), _sorted(through.table(name)), check_dtype=False,
                                      obj=name)

    # a large run reads it from its files: the manifest's count, SQL through DuckDB's view
    monkeypatch.setattr(dataset_read, "LARGE_EVENTS", 0)
    large = stepscope.load(copy, dataset=True)
    assert large.large and large.rows("step_gaps") == 5
    assert int(large.sql("select sum(kernels) as n from kernel_counts")["n"].iloc[0]) == len(memory.kernels)
    out = large.export("parquet", str(tmp_path / "parquet"))
    exported = pd.read_parquet(os.path.join(out, "step_gaps"))
    assert len(exported) == 5 and np.array_equal(np.sort(exported["gap_ns"]), np.sort(gaps["gap_ns"]))


def test_a_run_without_the_plugin_has_none_of_its_tables(run_dir):
    catalog_module.catalog.cache_clear()
    run = stepscope.load(_gpu_run(run_dir), cache=False)
    assert "step_gaps" not in run.tables
    with pytest.raises(AttributeError):
        run.step_gaps
    with pytest.raises(KeyError, match="not a table of this run"):
        run.table("step_gaps")


def test_every_table_with_rows_has_its_declared_columns_and_dtypes(gpu_fixture_runs, tmp_path):
    """The declarations are the tables' contract (docs/tables.md): a run recorded on a real
    GPU, read in memory and through its dataset, gives each table with rows exactly the
    declared columns and dtypes."""
    catalog_module.catalog.cache_clear()
    declared = catalog_module.catalog().tables()
    copy = tmp_path / "gpu-train"
    shutil.copytree(gpu_fixture_runs / "gpu-train", copy, ignore=shutil.ignore_patterns(CACHE_DIR))
    seen = set()
    for dataset in (False, True):
        run = stepscope.load(copy, quiet=True, cache=False, dataset=dataset)
        for name, table in declared.items():
            frame = run.table(name)
            assert list(frame.columns) == list(table.columns), name
            if len(frame):
                seen.add(name)
                assert _kinds(frame.dtypes.astype(str)) == _kinds(table.columns), (name, dataset)
    assert {"steps", "phases", "kernels", "memcpy", "cuda_api", "kernel_steps"} <= seen


def test_the_schemas_table_lists_are_the_built_in_catalogs():
    from stepscope.analysis.store.schema import DATASET_SAMPLES, DATASET_TABLES, DTYPES, RUN_TABLES

    built_in = catalog_module.BUILT_IN
    assert set(DATASET_TABLES) == {*built_in.names, *DATASET_SAMPLES}
    assert set(RUN_TABLES) == {*built_in.names, "ops", "samples", "stacks"}
    assert {t: dict(d.columns) for t, d in built_in.tables().items()} == {t: DTYPES[t] for t in built_in.tables()}
