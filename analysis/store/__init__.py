"""Where a run's tables come from: the trace decoded (``decode``), the tables' schema,
the Parquet dataset (built above the table builders, read below them) and the two
stores ``Run`` reads through (in memory, or the on-disk dataset)."""
