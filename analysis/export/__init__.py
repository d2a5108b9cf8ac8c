"""A run written for other tools: Chrome and Perfetto traces, Parquet tables, stack samples,
and the summary's aggregations as portable SQL (DuckDB, Spark)."""
