"""stepscope's vocabulary: the names every part of the project agrees on.

Phase names, step modes, event categories, GPU record enums, the files of a
run folder and the default run directory are written here once; the native
core (``csrc/``), the recording side (``core/``, ``integrations/``), the
readers (``analysis/``, ``compat/``) and the command line use these. Pure
Python: this module imports nothing (no stepscope module, no framework), so
anything may import it.

The native module declares the same phase and category names in C++
(``csrc/module.cc``; ``_native.PHASES``, ``_native.CATEGORIES``,
``_native.GPU_TYPES``); ``tests/test_vocabulary.py`` checks they are equal.
"""

# --- phases and steps (SPEC §3) -------------------------------------------------------
GETNEXT, FORWARD, LOSS, BACKWARD, OPTIMIZER = "GetNext", "Forward", "Loss", "Backward", "Optimizer"
#: The canonical phases, in order: the per-step columns of the steps table and the
#: phases of ``stepscope summary``.
PHASES = (GETNEXT, FORWARD, LOSS, BACKWARD, OPTIMIZER)
#: The compute phases (what a Keras profiler window samples; everything but GetNext).
COMPUTE_PHASES = (FORWARD, LOSS, BACKWARD, OPTIMIZER)
#: Activation-checkpointing recomputation: recorded as a phase nested in Backward, whose
#: exclusive time stays Backward's in the steps table.
RECOMPUTE = "Recompute"
#: Every phase name the core records (``stepscope.phase(name)`` accepts exactly these;
#: ``_native.PHASES``, interned first as ids 0..5).
PHASE_NAMES = (*PHASES, RECOMPUTE)
#: A step's time outside every phase (the steps table's last time column).
OTHER = "Other"

TRAIN, EVAL, PREDICT = "train", "eval", "predict"
#: Step modes (``stepscope.step(mode)``).
MODES = (TRAIN, EVAL, PREDICT)
#: The name of a step mark that ends the current step without starting another
#: (``stepscope.end_step()``, a loader running out, the session's stop).
END_MARK = "end"
#: The framework instant an integration records where a process begins another training
#: loop (SPEC §3): an optimizer created after train steps (a second model, the next fold,
#: fine-tuning after pre-training, the next trial of a search), another Keras ``fit``. The
#: steps after it belong to the next loop (``analysis/loops.py``).
LOOP_MARK = "stepscope.loop"
#: A step mark that flags the step open on its thread (the one its argument numbers)
#: as interrupted: it ended without its optimizer step (SPEC §3). Readers give that
#: step this mode, so it is in no mode's statistics, rules or phase shares.
INTERRUPTED = "interrupted"
#: A step mark that voids the step open on its thread (the one its argument numbers):
#: the call it began met the end of the data (Keras's last ``train_function`` call of an
#: epoch of unknown length). Readers take that step's begin mark as an end mark: its
#: time lies after its loop (SPEC §3), its number is given to the next step.
VOID_MARK = "void"
#: torch.compile (integrations/torch/_compile_events.py): a framework span per compile,
#: named ``COMPILE_PREFIX <compile id> <function> (<file>:<line>)``, and a framework instant
#: per recompile, ``RECOMPILE_PREFIX <compile id> <function> (<file>:<line>): <reason>``.
#: A graph break's instant: ``GRAPH_BREAK_PREFIX <file>:<line>: <dynamo's reason>``.
COMPILE_PREFIX = "torch.compile"
RECOMPILE_PREFIX = "torch.compile recompile"
GRAPH_BREAK_PREFIX = "torch.compile graph break"
#: A function that hit dynamo's recompile limit (it runs uncompiled from then on): an instant
#: ``COMPILE_LIMIT_PREFIX <compile id> <limit name> <limit>: <dynamo's last reason>``.
COMPILE_LIMIT_PREFIX = "torch.compile limit"
#: What dynamo measured of one compile besides its length: an instant at its end,
#: ``COMPILE_DETAIL_PREFIX <compile id> backend_ms=<x> inductor_ms=<y> cache_hits=<n> cache_misses=<n>``
#: (the backend's share of it, AOTAutograd and inductor; their local and remote caches' hits and misses).
COMPILE_DETAIL_PREFIX = "torch.compile detail"
#: tf.function's traces (integrations/tfdata/_tracing.py): a framework span per trace,
#: ``TRACE_PREFIX <function>#<n>: <cause>`` (first, python value, shape, signature).
TRACE_PREFIX = "tf.function trace"
#: The first two eager runs of each function TensorFlow built (integrations/tfdata/_tracing.py):
#: a framework span each, ``TF_RUN_PREFIX <function>/<id>#<1|2>`` (`` xla`` appended where it or
#: a function it calls must compile with XLA); the first run's extra time over the second is
#: the runtime's instantiation and optimization of the graph, and XLA's compile.
TF_RUN_PREFIX = "tf.function first run"
#: JAX's compiles (integrations/keras/_jax_backend.py, from jax.monitoring): a framework span
#: per stage, ``JAX_COMPILE_PREFIX <function>: <trace|lower|compile>``.
JAX_COMPILE_PREFIX = "jax compile"
#: every name compiling and tracing leave (the ones above begin with these)
COMPILING_PREFIXES = (COMPILE_PREFIX, TRACE_PREFIX, TF_RUN_PREFIX, JAX_COMPILE_PREFIX)
#: The framework span of the call that met the end of the data (a loader's
#: ``StopIteration``, tf.data's ``OutOfRangeError``): after its loop, in no step.
END_OF_DATA = "end of data"

# --- events (docs/format.md) ------------------------------------------------------------
#: Event categories by number (the category byte of a record; numbers 11-15 are free).
CATEGORIES = ("annotation", "phase", "step", "op", "module", "system", "gpu", "counter", "internal",
              "framework", "comm")
MAX_CATEGORIES = 16
#: Event kinds by number.
EVENT_KINDS = ("span", "instant", "counter")
#: An ``op`` span's argument (docs/format.md, "Operator spans"): the sequence number + 1 in
#: bits 0-31 (0: none), the op's index in its process (from 1) in bits 32-58, and in bits
#: 59-62 the phase its framework placed it in (0: none, read it from the time; else
#: 1 + its place in OP_PHASES).
OP_INDEX_MASK = (1 << 27) - 1
OP_PHASES = (*PHASE_NAMES, OTHER)


#: Collectives (docs/format.md, "Collectives"): a ``comm`` span named ``<kind>@<group>``
#: (COMM_KINDS; the group's name, the same on every rank) is the issuing call, on the
#: thread that made it; the same name and sequence number with COMM_DONE set is the
#: collective's completion, recorded when the backend finished it (async ones); a
#: ``comm`` counter of that name at the call's start holds its bytes. A ``comm`` span
#: named COMM_WAIT is a time the process waited for communication (``Work.wait``, DDP's
#: end of backward). The argument: the collective's number in its group, from 1 (bits
#: 0-39), and the flags below (bits 40-47). Point-to-point traffic is ``send`` and ``recv``
#: in a channel per direction, ``p2p:SRC>DST`` (global ranks), numbered in it.
COMM_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather",
              "scatter", "barrier", "send", "recv", "permute")
COMM_P2P = "p2p:"
COMM_WAIT = "wait"
COMM_ASYNC, COMM_DONE, COMM_DDP, COMM_LAST_BUCKET = 1, 2, 4, 8
COMM_SEQ_BITS = 40


def pack_comm_arg(seq: int, flags: int = 0) -> int:
    return (seq & ((1 << COMM_SEQ_BITS) - 1)) | (flags & 0xFF) << COMM_SEQ_BITS


def pack_op_arg(seq: int, index: int, phase: "str | None" = None) -> int:
    hint = OP_PHASES.index(phase) + 1 if phase is not None else 0
    return ((seq + 1) & 0xFFFFFFFF if seq >= 0 else 0) | (index & OP_INDEX_MASK) << 32 | hint << 59


#: The framework span the PyTorch integration records for each operator window: its closing
#: (Kineto stopped, its operators read and written).
TORCH_OP_WINDOW = "stepscope.op_window"
#: ... and its opening (Kineto prepared and started).
TORCH_OP_WINDOW_OPEN = "stepscope.op_window_open"
#: Both: stepscope's own time inside the steps it samples.
TORCH_OP_WINDOW_SPANS = (TORCH_OP_WINDOW_OPEN, TORCH_OP_WINDOW)
#: The framework span the Keras integration records for each sampled profiler window.
KERAS_PROFILER_WINDOW = "stepscope.profiler_window"
#: The framework span a PyTorch DataLoader worker records for each batch it makes (``arg``:
#: the worker id), and the instants a pass over a loader records of its setup (``arg``:
#: ``num_workers``; ``pin_memory`` and ``persistent_workers`` as 0 or 1). Readers select
#: these names exactly: torch's own ranges also carry "DataLoader" in their names
#: (``enumerate(DataLoader)#...``), with an op argument, not a worker id.
LOADER_FETCH = "DataLoader.fetch"
LOADER_NUM_WORKERS = "DataLoader.num_workers"
LOADER_PIN_MEMORY = "DataLoader.pin_memory"
LOADER_PERSISTENT = "DataLoader.persistent_workers"

# --- GPU activity records (CUPTI's numbering) ------------------------------------------
#: GPU record types by number.
GPU_TYPES = ("kernel", "memcpy", "memset", "sync", "runtime", "driver")
#: Copy kinds by CUPTI number (CUpti_ActivityMemcpyKind).
COPY_KINDS = ("unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP")
#: Memory kinds by CUPTI number (CUpti_ActivityMemoryKind).
MEMORY_KINDS = ("unknown", "pageable", "pinned", "device", "array", "managed", "device_static",
                "managed_static")
#: Synchronization types by CUPTI number (CUpti_ActivitySynchronizationType).
SYNC_TYPES = ("unknown", "event_synchronize", "stream_wait_event", "stream_synchronize",
              "context_synchronize")
#: The stream of a synchronization record that is not about one stream.
CONTEXT_STREAM = 0xFFFFFFFF
#: ``STEPSCOPE_GPU`` values.
GPU_MODES = ("auto", "off", "metrics", "trace")

# --- a run on disk (SPEC §4) ----------------------------------------------------------------
#: ``STEPSCOPE_DIR``'s default: the root folder of runs.
DEFAULT_DIR = "stepscope-runs"
#: Run metadata, in the run folder.
RUN_JSON = "run.json"
#: Process metadata, in each process folder.
PROCESS_JSON = "process.json"
#: The native core's events, in each process folder.
TRACE_FILE = "trace.ssc"
#: Clock offsets to the reference rank's host, in a rank's process folder (multi-node merge).
CLOCK_JSON = "clock.json"
#: Written by ``stepscope report`` into the run folder.
REPORT_FILE = "report.html"
#: The readers' Parquet cache of a finished run, in the run folder.
CACHE_DIR = ".stepscope-cache"


def node_lock_file(host: str) -> str:
    """The lock file, in the run folder, that elects one host-metrics sampler per host."""
    return f".node-{host}.lock"
