"""The tables of a run, declared once: their names, columns, dtypes and what each holds.

The builders (``analysis/tables/``), the two stores (in memory, the Parquet dataset),
the exports and the portable SQL all name tables and columns from here. The dtypes
are those of a table with rows, as ``stepscope.load(RUN).<table>`` gives it (an empty
table may have plainer ones: it is built from empty inputs; a column of strings is
``str`` or ``object`` as pandas infers it: pandas 3 gives ``str`` where every value is a
string). ``analysis/tables/catalog.py`` gives each its recipe; docs/tables.md lists them.
"""

from __future__ import annotations

from stepscope.core.vocabulary import OTHER, PHASES

_I, _I32, _NI, _NI32, _F, _C, _S, _O, _B = "int64", "int32", "Int64", "Int32", "float64", "category", "str", \
    "object", "boolean"


def _table(*columns):
    return dict(columns)


_GPU_ATTRIBUTION = (("launch_api", _O), ("launch_start_ns", _NI), ("mode", _O), ("step", _I), ("phase", _O))

# table -> {column: dtype}, in column order
DTYPES = {
    "events": _table(("process", _C), ("pid", _I32), ("host", _C), ("rank", _NI32), ("tid", _I), ("kind", _C),
                     ("category", _C), ("name", _C), ("start_ns", _I), ("end_ns", _I), ("duration_ns", _I),
                     ("step", _I32), ("arg", _I), ("value", _F)),
    "steps": _table(("process", _C), ("pid", _I32), ("rank", _NI), ("tid", _I), ("mode", _C), ("step", _I),
                    ("start_ns", _I), ("end_ns", _I), ("duration_ns", _I), *((p, _I) for p in PHASES), (OTHER, _I),
                    ("comm_ns", _I), ("comm_exposed_ns", _I), ("comm_overlapped_ns", _I), ("compile_ns", _I),
                    ("loop", _I)),
    "phases": _table(("process", _C), ("pid", _I32), ("rank", _NI32), ("tid", _I), ("mode", _C), ("step", _I32),
                     ("name", _C), ("start_ns", _I), ("end_ns", _I), ("duration_ns", _I), ("exclusive_ns", _I)),
    "system": _table(("timestamp", "datetime64[ns, UTC]"), ("timestamp_ns", _I), ("node", _S), ("process", _S),
                     ("metric", _S), ("device", _S), ("value", _F), ("unit", _S)),
    "kernels": _table(("process", _C), ("rank", _NI), ("device", _I), ("stream", _I), ("name", _C), ("start_ns", _I),
                      ("end_ns", _I), ("duration_ns", _I), ("correlation", _I), ("step", _I), ("pid", _I),
                      ("mode", _C), ("phase", _C), ("precision", _C), ("grid_x", _I), ("grid_y", _I), ("grid_z", _I),
                      ("block_x", _I), ("block_y", _I), ("block_z", _I), ("registers", _I), ("static_smem", _I),
                      ("dynamic_smem", _I), ("launch_api", _C), ("launch_start_ns", _NI),
                      ("launch_latency_ns", _NI), ("mangled", _C)),
    "memcpy": _table(("process", _C), ("rank", _NI), ("pid", _I), ("device", _I), ("stream", _I), ("kind", _O),
                     ("bytes", _I), ("src_memory", _O), ("dst_memory", _O), ("pinned", _B), ("start_ns", _I),
                     ("end_ns", _I), ("duration_ns", _I), ("bytes_per_s", _F), ("correlation", _I),
                     *_GPU_ATTRIBUTION, ("launch_latency_ns", _NI)),
    "memset": _table(("process", _C), ("rank", _NI), ("pid", _I), ("device", _I), ("stream", _I), ("bytes", _I),
                     ("memory", _O), ("start_ns", _I), ("end_ns", _I), ("duration_ns", _I), ("correlation", _I),
                     *_GPU_ATTRIBUTION, ("launch_latency_ns", _NI)),
    "sync": _table(("process", _C), ("rank", _NI), ("pid", _I), ("device", _I), ("stream", _I), ("kind", _O),
                   ("start_ns", _I), ("end_ns", _I), ("duration_ns", _I), ("correlation", _I), *_GPU_ATTRIBUTION,
                   ("gpu_idle_after_ns", _I)),
    "cuda_api": _table(("process", _C), ("rank", _NI), ("pid", _I), ("api", _C), ("thread", _I), ("name", _C),
                       ("start_ns", _I), ("end_ns", _I), ("duration_ns", _I), ("correlation", _I), ("mode", _C),
                       ("step", _I), ("phase", _C)),
    "ops": _table(("process", _O), ("pid", _I), ("rank", _I), ("tid", _I), ("mode", _O), ("step", _I),
                  ("phase", _O), ("name", _O), ("start_ns", _I), ("end_ns", _I), ("duration_ns", _I),
                  ("self_ns", _I), ("shapes", _O), ("sequence_nr", _I)),
    "samples": _table(("process", _C), ("pid", _I), ("rank", _NI), ("tid", _I), ("thread", _C), ("time_ns", _I),
                      ("interval_ns", _I), ("stack", _I), ("function", _C), ("file", _C), ("line", _I),
                      ("step", _I), ("mode", _S), ("phase", _S)),
    "stacks": _table(("stack", _I), ("parent", _I), ("depth", _I), ("function", _S), ("file", _S), ("line", _I)),
    "kernel_steps": _table(("process", _C), ("rank", _NI), ("device", _I), ("mode", _S), ("step", _I),
                           ("kernels", _I), ("kernel_ns", _I), ("kernel_ns_median", _F), ("busy_ns", _I),
                           ("gap_ns", _I), ("launch_gaps", _I), ("launch_gap_ns", _I),
                           ("launch_gap_ns_median", _F), ("launch_latency_ns_median", _F),
                           ("comm_kernel_ns", _I), ("comm_exposed_kernel_ns", _I)),
    "kernel_phases": _table(("process", _C), ("rank", _NI), ("device", _I), ("mode", _S), ("step", _I),
                            ("phase", _S), ("kernels", _I), ("kernel_ns", _I), ("busy_ns", _I),
                            ("launch_gap_ns", _I)),
    "kernel_names": _table(("process", _C), ("rank", _NI), ("device", _I), ("mode", _S), ("name", _S),
                           ("precision", _S), ("kernels", _I), ("kernel_ns", _I)),
}

DESCRIPTIONS = {
    "events": "every recorded event (spans, instants, counters), times on the wall clock",
    "steps": "one row per step of a thread's loop: mode, loop, times and the time in each phase",
    "phases": "each phase span with its step and exclusive time",
    "system": "system, process and GPU metrics over time, one row per sample and metric",
    "kernels": "GPU kernels with their launch, step, phase and precision",
    "memcpy": "GPU memory copies with their launch, step and phase",
    "memset": "GPU memory sets with their launch, step and phase",
    "sync": "GPU synchronisations, and how long the GPU idled after each",
    "cuda_api": "the CUDA runtime and driver calls that launched GPU work",
    "ops": "operator events of the sampled steps, with phase, self time and shapes",
    "samples": "Python stack samples with their leaf frame, step, mode and phase",
    "stacks": "the distinct Python stacks of samples: parent, depth and leaf frame",
    "kernel_steps": "compute kernels per (process, device, step): count, time, busy time, gaps, launch gaps; "
                    "NCCL kernels' time, and the part of it with no compute kernel running",
    "kernel_phases": "kernel_steps' additive figures split by the phase that launched the kernels",
    "kernel_names": "every kernel's count and time per (process, device, mode, name)",
    "pysamples": "Python stack samples as recorded (the dataset's; samples is built from them)",
    "pystacks": "each process's stacks as recorded (the dataset's; ids are the process's own)",
}

COLUMNS = {table: list(dtypes) for table, dtypes in DTYPES.items()}
EVENT_COLUMNS = COLUMNS["events"]
STEP_COLUMNS = COLUMNS["steps"]
#: per step, the communication in flight, the part of it the process waited on, the rest
#: (analysis/tables/comm.py); the columns before them come from the steps and phases
STEP_COMM_COLUMNS = ("comm_ns", "comm_exposed_ns", "comm_overlapped_ns")
#: per step, the time its process spent compiling or tracing (analysis/tables/compiling.py)
STEP_COMPILE_COLUMN = "compile_ns"
#: per step, its loop in its process, from 0 (analysis/loops.py)
STEP_LOOP_COLUMN = "loop"
STEP_PHASE_COLUMNS = [c for c in STEP_COLUMNS if c not in (*STEP_COMM_COLUMNS, STEP_COMPILE_COLUMN, STEP_LOOP_COLUMN)]
PHASE_COLUMNS = COLUMNS["phases"]
SYSTEM_COLUMNS = COLUMNS["system"]
KERNEL_COLUMNS = COLUMNS["kernels"]
MEMCPY_COLUMNS = COLUMNS["memcpy"]
MEMSET_COLUMNS = COLUMNS["memset"]
SYNC_COLUMNS = COLUMNS["sync"]
API_COLUMNS = COLUMNS["cuda_api"]
OP_COLUMNS = COLUMNS["ops"]
SAMPLE_COLUMNS = COLUMNS["samples"]
STACK_COLUMNS = COLUMNS["stacks"]
KERNEL_STEP_COLUMNS = COLUMNS["kernel_steps"]
KERNEL_PHASE_COLUMNS = COLUMNS["kernel_phases"]
KERNEL_NAME_COLUMNS = COLUMNS["kernel_names"]

# --- which tables, for what --------------------------------------------------------------
# (how each is built: analysis/tables/catalog.py; these name the built-in ones)
GPU_TABLES = ("kernels", "memcpy", "memset", "sync", "cuda_api")  # built together from the GPU records
KERNEL_AGGREGATES = ("kernel_steps", "kernel_phases", "kernel_names")  # what the GPU rules read
# Every built-in table ``Run`` has (``run.tables`` adds the plugins')
RUN_TABLES = ("events", "steps", "phases", "system", *GPU_TABLES, "ops", "samples", "stacks", *KERNEL_AGGREGATES)
# Python stack samples as recorded, beside the catalog's tables in the dataset: each process's stack ids are its own
DATASET_SAMPLES = ("pysamples", "pystacks")
DATASET_TABLES = ("events", "steps", "phases", "system", *GPU_TABLES, *KERNEL_AGGREGATES, *DATASET_SAMPLES)

# The version of the cached tables (the in-memory cache and the dataset): a cache of another is rebuilt.
# 2: GPU records cached beside the events; 3: pid and rank are 32-bit; 4: Python samples;
# 5: kernels aggregated per step, syncs' GPU idle time after them; 6: the large GPU tables' strings categorical;
# 8: steps' communication columns, kernel_steps' NCCL columns (issue 46)
# 7: steps' Other where a process ran loops on several threads and had phases outside every step (issue 43)
# 9: steps' loop; a void mark's step read as an end (issue 58); 10: steps' compile_ns (issue 59)
CACHE_VERSION = 10
