"""docs/tables.md, generated from the tables' declarations (``catalog.BUILT_IN``):

    python3 -m stepscope.analysis.tables.reference > docs/tables.md
"""

from __future__ import annotations

from stepscope.analysis.store.schema import DESCRIPTIONS, DTYPES
from stepscope.analysis.tables.catalog import BUILT_IN


def tables_markdown() -> str:
    lines = ["<!-- generated: python3 -m stepscope.analysis.tables.reference > docs/tables.md -->",
             "# Tables", "",
             "Every table `stepscope.load(RUN)` builds from the run's traces, as declared in",
             "`analysis/tables/catalog.py` (columns: `analysis/store/schema.py`). Each is",
             "`run.<name>` and `run.table(name)`, a name in `run.sql(...)`, a folder of the run's",
             "Parquet dataset (`<name>/process=<process>/part-*.parquet`, docs/format.md) and a",
             "file of `stepscope export --format parquet`. `ops`, `samples` and `stacks` are built",
             "by `Run` from selections of these (README). Plugins add tables",
             "(docs/design.md, \"Tables, declared once\").", ""]
    lines += _table("events", DESCRIPTIONS["events"], "Decoded from the traces (the source of the others); rows "
                    "sorted by `start_ns` within each `process`.", DTYPES["events"])
    for recipe in BUILT_IN.recipes:
        inputs = ", ".join(f"`{i}`" for i in recipe.inputs)
        how = " a part of the GPU records at a time in the dataset;" if recipe.by_part else \
            " per part of its input in the dataset, then combined;" if recipe.combine else ""
        for t in recipe.tables:
            others = ", ".join(f"`{n}`" for n in recipe.names if n != t.name)
            lines += _table(t.name, t.description, f"Built from {inputs}{f' (with {others})' if others else ''};"
                            f"{how} rows sorted by `{t.sort_by}` within each `{t.partition_by}`.", t.columns)
    return "\n".join(lines)


def _table(name: str, description: str, how: str, columns) -> list:
    return [f"## {name}", "", f"{description[0].upper()}{description[1:]}.", "", how, "",
            "| column | dtype |", "| --- | --- |", *(f"| `{c}` | {d} |" for c, d in columns.items()), ""]


if __name__ == "__main__":
    print(tables_markdown())
