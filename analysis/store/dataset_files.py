"""The dataset's files: where each table's partition of a process lies, and how one
Parquet file is written (docs/format.md: ``<root>/<table>/process=<process>/part-*.parquet``)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pandas as pd

PARTITION = "process"
COLUMNS_KEY = b"stepscope.columns"
# Rows per Parquet row group: a time window's read skips the groups outside it by their
# statistics, so smaller groups read less of a large trace (DuckDB writes 122,880)
ROW_GROUP_ROWS = 1 << 17
SLICE_ROWS = 1 << 20  # rows converted to Arrow at once when a file is written (8 row groups)


def partition_dir(root: str, table: str, process: str) -> str:
    return os.path.join(root, table, f"{PARTITION}={process}")


def safe_partition(process: str) -> str:
    # Process folders are "<host>-<rank or pid>"; anything a path or a Hive key cannot hold is replaced.
    return re.sub(r"[^A-Za-z0-9._+@-]", "_", process)



def write_file(frame: pd.DataFrame, path: str, row_group: int = ROW_GROUP_ROWS) -> None:
    """One Parquet file in row groups of ``row_group`` rows, handed to Arrow ``SLICE_ROWS``
    at a time: a conversion per row group costs a tenth of a large GPU part's build, one
    of the whole table holds it twice (+0.4 GiB at 1 B records, BENCHMARKS.md)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # where the partition column goes back on read, and its dtype there
    order = json.dumps(list(frame.columns) + [str(frame[PARTITION].dtype) if PARTITION in frame else ""])
    frame = frame.drop(columns=[PARTITION], errors="ignore")
    schema = pa.Schema.from_pandas(frame.iloc[:0], preserve_index=False)
    schema = schema.with_metadata({**(schema.metadata or {}), COLUMNS_KEY: order.encode()})
    tmp = f"{path}.tmp{os.getpid()}"
    with pq.ParquetWriter(tmp, schema, **encodings(schema)) as writer:
        for at in range(0, max(len(frame), 1), SLICE_ROWS):
            writer.write_table(pa.Table.from_pandas(frame.iloc[at:at + SLICE_ROWS], schema=schema,
                                                    preserve_index=False), row_group_size=row_group)
    os.replace(tmp, path)


# Integer columns with a few distinct values (per process, device, stream, launch configuration)
LOW_CARDINALITY = {"pid", "rank", "tid", "thread", "device", "stream", "grid_x", "grid_y", "grid_z", "block_x",
                   "block_y", "block_z", "registers", "static_smem", "dynamic_smem"}


def encodings(schema) -> dict:
    """Parquet encodings by column: dictionaries for strings and the few-valued integers,
    delta encoding for the other integers (times, ids, durations: nearly sorted or small).
    Arrow's default tries a dictionary on every column, which costs more than half of a
    GPU table's write for numbers that rarely repeat; deltas write faster than plain
    values and make a GPU table's files 4-10 times smaller. Both are standard Parquet
    encodings that DuckDB, Spark and Trino read."""
    import pyarrow as pa

    dictionary, delta = [], {}
    for f in schema:
        if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type) or pa.types.is_large_string(f.type) \
                or f.name in LOW_CARDINALITY:
            dictionary.append(f.name)
        elif pa.types.is_integer(f.type):
            delta[f.name] = "DELTA_BINARY_PACKED"
    return {"use_dictionary": dictionary, "column_encoding": delta} if delta else {"use_dictionary": dictionary}




def link_or_copy(src: str, dest: str) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)

