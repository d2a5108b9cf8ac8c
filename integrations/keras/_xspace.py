"""Phases of compiled TensorFlow steps, read from a profiler XSpace.

The XSpace is TensorFlow's own protobuf (``tsl/profiler/protobuf/xplane.proto``;
the classes ship with TensorFlow as ``xplane_pb2``). Inside a compiled Keras
step every op carries the TF name scope it was built in:

    .../gradient_tape/...      Backward
    .../<optimizer name>/...   Optimizer   (``adam``, ``sgd``, ...)
    .../compile_loss/...       Loss        (else: see _unscoped_loss)
    .../<model name>/...       Forward
    anything else              Other       (metrics, step counters)

Keras uniquifies scopes (``sequential`` becomes ``sequential_1``), so a scope
matches its name with any ``_<n>`` suffixes. With XLA (``jit_compile=True``)
the host runs fused HLO instructions instead of TF ops; the HLO module stored
in the XSpace's metadata plane maps each instruction, and every instruction
fused into it, back to its TF op name, and a fusion's time is split among
the phases of its parts (by their count).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

SYNC_NAME = "stepscope.sync"
ORDER = ("Forward", "Loss", "Backward", "Optimizer")
_TF_OP = re.compile(r"([^:]+):([A-Za-z_]\w*)$")  # "scope/op:OpType" (not "Executor::Run")
_HLO_SUFFIX = re.compile(r"\.\d+$")  # "fusion.12" -> "fusion"
# an in-graph fetch: get_next(), or get_next_as_optional() (a distribution strategy's
# iterator, steps_per_execution > 1)
GETNEXT_EVENTS = frozenset({"IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute"})
ITERATOR_PREFIX = "Iterator::"  # tf.data's per-iterator spans, nested by pipeline stage


def _scope(name: str):
    return re.compile(re.escape(name) + r"(_\d+)*$")


class Scopes:
    """Which name-scope segment means which phase."""

    def __init__(self, model_name: str, optimizer_name):
        """optimizer_name: a name or several (a wrapper's and its inner optimizer's)."""
        names = (optimizer_name,) if isinstance(optimizer_name, str) or optimizer_name is None else optimizer_name
        self.key = (model_name, *names)
        self.rules = [(re.compile(r"gradient_tape$"), "Backward")]
        for name in names:
            if name:
                self.rules.append((_scope(name), "Optimizer"))
        self.rules.append((re.compile(r"compile_loss$"), "Loss"))
        self.rules.append((_scope(model_name), "Forward"))

    def phase(self, op_name: str) -> Optional[str]:
        segments = op_name.split("/")
        for pattern, phase in self.rules:  # in order: a gradient of a model op is Backward
            if any(pattern.match(s) for s in segments):
                return phase
        return None


@dataclass
class Op:
    start_ns: float
    end_ns: float
    weights: Dict[Optional[str], float]  # phase (None: Other) -> share of this op's time
    name: str = ""  # the op's type ("MatMul"), or the HLO instruction's kind ("fusion")
    line: int = 0  # the XSpace line (one per thread) it ran on

    @property
    def phase(self) -> Optional[str]:
        """The phase with the largest share of it (None: Other)."""
        return max(self.weights.items(), key=lambda kv: kv[1])[0] if self.weights else None


@dataclass
class Trace:
    ops: List[Op] = field(default_factory=list)
    getnext: List[Tuple[float, float]] = field(default_factory=list)  # in-graph iterator fetches
    sync: List[Tuple[float, float]] = field(default_factory=list)  # our TraceMe marks
    # tf.data's per-iterator events ("Iterator::Root::Prefetch::ParallelMapV2"): (name, start, end, line)
    data: List[Tuple[str, float, float, int]] = field(default_factory=list)


def _xspace_class():
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2.XSpace


_hlo_cache: Dict[Tuple[str, tuple], Dict[Tuple[str, str], Dict[Optional[str], float]]] = {}


def _hlo_phases(metadata_plane, scopes: Scopes) -> Dict[Tuple[str, str], Dict[Optional[str], float]]:
    """(module, instruction) -> phase weights, from the HLO protos of the metadata plane.

    A compiled program does not change between windows: each module is read once
    per process (reading one costs ~10 ms in Python)."""
    out: Dict[Tuple[str, str], Dict[Optional[str], float]] = {}
    for md in metadata_plane.event_metadata.values():
        for stat in md.stats:
            if stat.bytes_value:
                key = (md.name, scopes.key)
                if key not in _hlo_cache:
                    _hlo_cache[key] = _module_phases(stat.bytes_value, scopes)
                out.update(_hlo_cache[key])
    return out


def _module_phases(data: bytes, scopes: Scopes) -> Dict[Tuple[str, str], Dict[Optional[str], float]]:
    """Phase weights of every instruction of one HLO module: those of the
    instructions fused into it, else its own op name's."""
    from tensorflow.compiler.xla.service import hlo_pb2

    proto = hlo_pb2.HloProto()
    proto.ParseFromString(data)
    module = proto.hlo_module
    computations = {c.id: c for c in module.computations}
    out: Dict[Tuple[str, str], Dict[Optional[str], float]] = {}
    for comp in module.computations:
        for ins in comp.instructions:
            counts: Counter = Counter()
            for cid in ins.called_computation_ids:
                for inner in getattr(computations.get(cid), "instructions", ()):
                    phase = scopes.phase(inner.metadata.op_name) if inner.metadata.op_name else None
                    if phase is not None:
                        counts[phase] += 1
            if not counts and ins.metadata.op_name:
                counts[scopes.phase(ins.metadata.op_name)] += 1
            total = sum(counts.values())
            out[(module.name, ins.name)] = {p: n / total for p, n in counts.items()} if total else {None: 1.0}
    return out


def parse(data: bytes, scopes: Scopes) -> Trace:
    """The ops of the host plane with their phase weights, and our sync marks."""
    space = _xspace_class()()
    space.ParseFromString(data)
    planes = {p.name: p for p in space.planes}
    hlo = _hlo_phases(planes["/host:metadata"], scopes) if "/host:metadata" in planes else {}
    trace = Trace()
    host = planes.get("/host:CPU")
    if host is None:
        return trace
    stat_names = {k: v.name for k, v in host.stat_metadata.items()}
    hlo_op = next((k for k, v in stat_names.items() if v == "hlo_op"), None)
    hlo_module = next((k for k, v in stat_names.items() if v == "hlo_module"), None)
    tf_phase: Dict[int, Optional[Tuple[Dict[Optional[str], float], str]]] = {}  # metadata id -> (weights, type)
    for line in host.lines:
        is_data = line.name.startswith("tf_data")
        base = line.timestamp_ns
        for ev in line.events:
            name = host.event_metadata[ev.metadata_id].name
            t0 = base + ev.offset_ps / 1000.0
            t1 = t0 + ev.duration_ps / 1000.0
            if name == SYNC_NAME:
                trace.sync.append((t0, t1))
                continue
            if name in GETNEXT_EVENTS:
                trace.getnext.append((t0, t1))
                continue
            if name.startswith(ITERATOR_PREFIX):  # on tf.data's threads, or the thread that fetches
                if ev.duration_ps:
                    trace.data.append((name, t0, t1, line.id))
                continue
            if is_data or not ev.duration_ps:
                continue
            weights = None
            if hlo_op is not None:
                refs = {s.metadata_id: s.ref_value for s in ev.stats if s.metadata_id in (hlo_op, hlo_module)}
                if hlo_op in refs:
                    instruction = stat_names.get(refs[hlo_op], "")
                    weights = hlo.get((stat_names.get(refs.get(hlo_module), ""), instruction), {None: 1.0})
                    trace.ops.append(Op(t0, t1, weights, _HLO_SUFFIX.sub("", instruction) or name, line.id))
                    continue
            if ev.metadata_id not in tf_phase:
                m = _TF_OP.match(name)
                tf_phase[ev.metadata_id] = ({scopes.phase(m.group(1)): 1.0}, m.group(2)) if m else None
            known = tf_phase[ev.metadata_id]
            if known is not None:
                trace.ops.append(Op(t0, t1, known[0], known[1], line.id))
    return trace


def split_step(trace: Trace, t0: float, t1: float):
    """One step's phases as consecutive spans [(phase, start, end)] in XSpace time.

    GetNext keeps its measured in-graph time. The compute phases share the
    time from the step's first op to its last in proportion to their op time
    (ops run on several threads at once, so measured op times overlap), laid
    out in execution order; the rest of that time is Other.
    """
    ops = [op for op in trace.ops if t0 <= op.start_ns < t1]
    spans = []
    cursor = None
    for g0, g1 in trace.getnext:
        if t0 <= g0 < t1:
            spans.append(("GetNext", g0, min(g1, t1)))
            cursor = max(cursor or g1, min(g1, t1))
    if not ops:
        return spans
    start = min(op.start_ns for op in ops)
    end = min(max(op.end_ns for op in ops), t1)
    start = max(start, cursor or start)
    busy: Counter = Counter()
    for op in ops:
        for phase, w in op.weights.items():
            busy[phase] += (op.end_ns - op.start_ns) * w
    if not busy.get("Loss"):
        busy["Loss"] = _unscoped_loss(ops)
        busy[None] -= busy["Loss"]
    total = sum(busy.values())
    if total <= 0 or end <= start:
        return spans
    at = start
    for phase in ORDER:
        length = (end - start) * busy.get(phase, 0.0) / total
        if length > 0:
            spans.append((phase, at, at + length))
            at += length
    return spans


def _unscoped_loss(ops: List[Op]) -> float:
    """Op time of a loss computed with raw ops (a custom ``train_step`` under a
    GradientTape: ``tf.reduce_mean(tf.square(pred - y))`` has no ``compile_loss``
    scope, nor any other): the ops of no phase that start after the model's last
    forward op ends and before the first gradient op starts. The gradients need
    the loss, and the loss the forward's output, so nothing else of the step's
    own work runs in between (a metric of the loss may start there too)."""
    forward_end = max((op.end_ns for op in ops if op.weights.get("Forward")), default=None)
    backward_start = min((op.start_ns for op in ops if op.weights.get("Backward")), default=None)
    if forward_end is None or backward_start is None or backward_start <= forward_end:
        return 0.0
    return sum((op.end_ns - op.start_ns) * op.weights.get(None, 0.0) for op in ops
               if forward_end <= op.start_ns < backward_start)
