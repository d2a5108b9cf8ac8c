"""The table builders: steps, phases, GPU activity, samples, system metrics, operators,
from the decoded events (plain functions over DataFrames)."""
