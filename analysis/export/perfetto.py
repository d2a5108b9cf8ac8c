"""Perfetto's native trace format: a protobuf ``Trace`` of ``TracePacket``s with ``TrackEvent``s.

Written without a protobuf library: the few header packets (track descriptors, interned
names, clock snapshots) are built in Python; the millions of slice begin/end packets are
encoded column-wise with numpy (varints of whole arrays written at computed offsets).

Layout: one packet sequence per track (a thread, a process's steps, a thread's CUDA calls,
a GPU stream), so each sequence carries its own interned names, its track as the
``track_event_defaults`` and an incremental clock (id 64) whose timestamps are deltas from
the previous packet. Its slice packets (~19 bytes a begin, ~14 an end) go in
zlib-compressed chunks (``compressed_packets``, which trace_processor inflates), ~6 bytes
an event in all. Track descriptors go first, on sequence 1. Times are the run's wall clock
(epoch ns), given to Perfetto as BOOTTIME, the default trace clock.

Field numbers below are from Perfetto's .proto files (protos/perfetto/trace/...).
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Callable, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.gpu_activity import device_operations, host_launches
from stepscope.analysis.export.trace_names import CPU_CATS, GPU_CATS, step_name
from stepscope.core import files
from stepscope.core.vocabulary import PROCESS_JSON

# trace.proto: Trace.packet = 1
TRACE_PACKET = 1
# trace_packet.proto: TracePacket
PKT_TIMESTAMP, PKT_CLOCK_SNAPSHOT, PKT_SEQ_ID, PKT_TRACK_EVENT, PKT_INTERNED = 8, 6, 10, 11, 12
PKT_SEQ_FLAGS, PKT_CLOCK_ID, PKT_DEFAULTS, PKT_TRACK_DESCRIPTOR = 13, 58, 59, 60
PKT_COMPRESSED = 50  # deflate (zlib) of serialized packets, each as a Trace.packet field
CHUNK_BYTES = 1 << 20
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2  # TracePacket.SequenceFlags
# trace_packet_defaults.proto: TracePacketDefaults.timestamp_clock_id = 58, .track_event_defaults = 11;
# TrackEventDefaults.track_uuid = 11
DEF_CLOCK_ID, DEF_TRACK_EVENT, TED_TRACK_UUID = 58, 11, 11
# clock_snapshot.proto: ClockSnapshot.clocks = 1; Clock.clock_id = 1, .timestamp = 2, .is_incremental = 3
CS_CLOCKS, CLK_ID, CLK_TIMESTAMP, CLK_INCREMENTAL = 1, 1, 2, 3
BOOTTIME, SEQUENCE_CLOCK = 6, 64  # builtin BOOTTIME; 64-127 are sequence-scoped clocks
# track_event.proto: TrackEvent.type = 9 (TYPE_SLICE_BEGIN 1, TYPE_SLICE_END 2, TYPE_INSTANT 3),
# .category_iids = 3, .name_iid = 10
TE_TYPE, TE_CATEGORY_IIDS, TE_NAME_IID = 9, 3, 10
SLICE_BEGIN, SLICE_END, INSTANT = 1, 2, 3
# interned_data.proto: InternedData.event_categories = 1, .event_names = 2;
# EventCategory / EventName: iid = 1, name = 2
INT_CATEGORIES, INT_NAMES, IID, IID_NAME = 1, 2, 1, 2
# track_descriptor.proto: TrackDescriptor.uuid = 1, .name = 2, .process = 3, .thread = 4, .parent_uuid = 5
TD_UUID, TD_NAME, TD_PROCESS, TD_THREAD, TD_PARENT = 1, 2, 3, 4, 5
# process_descriptor.proto: pid = 1, process_name = 6; thread_descriptor.proto: pid = 1, tid = 2, thread_name = 5
PD_PID, PD_NAME, THD_PID, THD_TID, THD_NAME = 1, 6, 1, 2, 5

VARINT, LEN = 0, 2


# --- scalar protobuf (headers) ---------------------------------------------------------------
def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1  # negative int32/int64 are written as 10-byte two's complement
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _int(field: int, v: int) -> bytes:
    return _varint(field << 3 | VARINT) + _varint(int(v))


def _msg(field: int, *parts) -> bytes:
    body = b"".join(p.encode("utf-8") if isinstance(p, str) else p for p in parts)
    return _varint(field << 3 | LEN) + _varint(len(body)) + body


def _packet(*parts: bytes) -> bytes:
    return _msg(TRACE_PACKET, *parts)


# --- column-wise varints (events) ------------------------------------------------------------
def _varint_len(v: np.ndarray) -> np.ndarray:
    n = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        n += v >= np.uint64(1 << (7 * k))
    return n


def _pack(n: int, segments) -> tuple:
    """Rows of bytes, each the concatenation of `segments`: (bytes, mask) constants,
    (uint64 array, lengths, mask) varints or ((flat uint8 buffer, starts, lengths), None)
    strings; a mask (bool array or None) says which rows have it.
    Returns (buffer, row offsets with the end appended)."""
    lengths = np.zeros(n, dtype=np.int64)
    for seg in segments:
        size = len(seg[0]) if isinstance(seg[0], bytes) else seg[0][2] if isinstance(seg[0], tuple) else seg[1]
        lengths += size if seg[-1] is None else np.where(seg[-1], size, 0)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    buf = np.empty(int(offsets[-1]), dtype=np.uint8)
    pos = offsets[:-1].copy()
    for seg in segments:
        mask = seg[-1]
        at = pos if mask is None else pos[mask]
        if isinstance(seg[0], bytes):
            for k, b in enumerate(seg[0]):
                buf[at + k] = b
            size = len(seg[0])
        elif isinstance(seg[0], tuple):  # variable-length rows copied from a flat buffer (no mask)
            flat, start, size = seg[0]
            total = int(size.sum())
            within = np.arange(total) - np.repeat(np.cumsum(size) - size, size)
            buf[np.repeat(at, size) + within] = flat[np.repeat(start, size) + within]
        else:
            values, size = seg[0], seg[1]
            if mask is not None:
                values, vlen = values[mask], size[mask]
            else:
                vlen = size
            for k in range(int(vlen.max()) if len(vlen) else 0):
                more = vlen > k
                byte = ((values[more] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
                byte[vlen[more] > k + 1] |= 0x80
                buf[at[more] + k] = byte
        pos += size if mask is None else np.where(mask, size, 0)
    return buf, offsets


# --- tracks ----------------------------------------------------------------------------------
class _Tracks:
    """Track descriptors (uuids from 1) and the slice tracks' input columns."""

    def __init__(self):
        self.descriptors = []
        self.slice_tracks = []  # uuid per slice track index
        self.columns = []  # (track index array, start, end, name codes, category codes, instant) per source
        self.names = {}
        self.categories = {}

    def add(self, descriptor: bytes, slices: bool) -> int:
        uuid = len(self.descriptors) + 1
        self.descriptors.append(_packet(_int(PKT_SEQ_ID, 1), _msg(PKT_TRACK_DESCRIPTOR, _int(TD_UUID, uuid),
                                                                   descriptor)))
        if slices:
            self.slice_tracks.append(uuid)
            return len(self.slice_tracks) - 1
        return uuid

    def codes(self, table: dict, values, rename=None) -> np.ndarray:
        """Codes of `values` (pandas categorical or strings) in one table of strings."""
        cat = values.array if isinstance(values, pd.Series) and values.dtype == "category" else pd.Categorical(values)
        rename = rename or {}
        mapping = np.array([table.setdefault(rename.get(str(c), str(c)), len(table)) for c in cat.categories],
                           dtype=np.int64)
        return mapping[cat.codes] if len(mapping) else np.zeros(len(cat), dtype=np.int64)


def _thread_names(run, process: str) -> dict:
    try:
        with open(os.path.join(run.path, process, PROCESS_JSON)) as f:
            return {int(t): str(n) for t, n in (json.load(f).get("threads") or {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _collect(run) -> _Tracks:
    tracks = _Tracks()
    procs = run.processes
    ev = run.events
    if len(ev):
        ev = ev[(ev["kind"] == "span") | ((ev["kind"] == "instant") & (ev["category"] != "step"))]
    pids, hosts, puuid = {}, {}, {}
    for p in procs.itertuples(index=False):
        rank = p.rank
        label = p.process if rank is None or rank != rank else f"{p.process} (rank {int(rank)})"
        pid = int(p.pid) if p.pid == p.pid and p.pid is not None else 0
        pids[p.process], hosts[p.process] = pid, p.host
        puuid[p.process] = tracks.add(_msg(TD_PROCESS, _int(PD_PID, pid), _msg(PD_NAME, label)), slices=False)
    # threads: spans and instants of the events table, in its order (start, parents first)
    if len(ev):
        proc_cat = pd.Categorical(ev["process"])
        tids = ev["tid"].to_numpy(np.int64)
        thread_codes, keys = pd.factorize(proc_cat.codes.astype(np.int64) << 32 | (tids & 0xFFFFFFFF))
        first = np.unique(thread_codes, return_index=True)[1]
        threads = [(str(proc_cat[i]), int(tids[i])) for i in first]
        index = np.empty(len(threads), dtype=np.int64)
        for k, (process, tid) in enumerate(threads):
            name = _thread_names(run, process).get(int(tid))
            body = [_int(THD_PID, pids.get(process, 0)), _int(THD_TID, int(tid))]
            if name:
                body.append(_msg(THD_NAME, name))
            index[k] = tracks.add(_msg(TD_THREAD, *body), slices=True)
        tracks.columns.append((index[thread_codes], ev["start_ns"].to_numpy(np.int64), ev["end_ns"].to_numpy(np.int64),
                               tracks.codes(tracks.names, ev["name"]),
                               tracks.codes(tracks.categories, ev["category"], CPU_CATS),
                               (ev["kind"] == "instant").to_numpy()))
    # steps, one track per process
    steps = run.steps
    if len(steps):
        steps = steps.sort_values(["process", "start_ns"], kind="stable")
        step_track = {p: tracks.add(_int(TD_PARENT, puuid[p]) + _msg(TD_NAME, "steps"), slices=True)
                      for p in steps["process"].unique() if p in puuid}
        steps = steps[steps["process"].isin(list(step_track))]
        names = [step_name(m, s) for m, s in zip(steps["mode"].astype(str), steps["step"])]
        tracks.columns.append((steps["process"].map(step_track).to_numpy(np.int64),
                               steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64),
                               tracks.codes(tracks.names, names),
                               tracks.codes(tracks.categories, ["user_annotation"] * len(steps)),
                               np.zeros(len(steps), dtype=bool)))
    # CUDA calls: a track per calling thread, under its process
    calls = host_launches(run)
    calls = calls[calls["process"].isin(list(puuid))]
    if len(calls):
        calls = calls.assign(dur=calls["end_ns"] - calls["start_ns"]).sort_values(
            ["process", "thread", "start_ns", "dur"], ascending=[True, True, True, False], kind="stable")
        key = list(zip(calls["process"], calls["thread"]))
        track_of = {}
        for process, thread in dict.fromkeys(key):
            track_of[(process, thread)] = tracks.add(
                _int(TD_PARENT, puuid[process]) + _msg(TD_NAME, f"CUDA API (thread {thread})"), slices=True)
        tracks.columns.append((np.array([track_of[k] for k in key], dtype=np.int64),
                               calls["start_ns"].to_numpy(np.int64), calls["end_ns"].to_numpy(np.int64),
                               tracks.codes(tracks.names, calls["name"]),
                               tracks.codes(tracks.categories, ["cuda_runtime"] * len(calls)),
                               np.zeros(len(calls), dtype=bool)))
    # GPU work: a track per device and host, a child track per stream
    ops = device_operations(run)
    if len(ops):
        ops = ops.assign(host=ops["process"].map(hosts).fillna("").astype(str))
        ops = ops.sort_values(["host", "device", "stream", "start_ns", "duration_ns"],
                              ascending=[True, True, True, True, False], kind="stable")
        key = list(zip(ops["host"], ops["device"], ops["stream"]))
        device_uuid, track_of = {}, {}
        for host, device, stream in dict.fromkeys(key):
            if (host, device) not in device_uuid:
                label = f"GPU {device}" + (f" ({host})" if host else "")
                device_uuid[(host, device)] = tracks.add(_msg(TD_NAME, label), slices=False)
            label = "context (syncs)" if stream < 0 else f"stream {stream}"
            track_of[(host, device, stream)] = tracks.add(
                _int(TD_PARENT, device_uuid[(host, device)]) + _msg(TD_NAME, label), slices=True)
        tracks.columns.append((np.array([track_of[k] for k in key], dtype=np.int64),
                               ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64),
                               tracks.codes(tracks.names, ops["name"]),
                               tracks.codes(tracks.categories, ops["kind"].map(GPU_CATS)),
                               np.zeros(len(ops), dtype=bool)))
    return tracks


def _ordered(track, start, end, instant):
    """Begin/end rows of each track in an order Perfetto nests correctly: by time; at equal
    times ends first, latest begun first (LIFO); begins in input order (start, parents first);
    a zero-length span ends right after it begins; instants have no end."""
    n = len(track)
    order = np.argsort(track, kind="stable")  # groups tracks, keeps each one's input order
    track, start, end, instant = track[order], start[order], end[order], instant[order]
    zero = (end <= start) & ~instant
    has_end = ~instant & ~zero
    # rows: ends (reverse input order), then begins each followed by its zero-length end
    ends = np.flatnonzero(has_end)[::-1]
    inline = np.repeat(np.arange(n), 1 + zero)
    second = np.zeros(len(inline), dtype=bool)
    second[1:] = inline[1:] == inline[:-1]
    src = np.concatenate([ends, inline])
    inline_kind = np.where(second, SLICE_END, np.where(instant[inline], INSTANT, SLICE_BEGIN)).astype(np.uint8)
    kind = np.concatenate([np.full(len(ends), SLICE_END, np.uint8), inline_kind])
    time = np.concatenate([end[ends], start[inline]])
    rtrack = track[src]
    # one stable sort on time made increasing across tracks (each track shifted past the last)
    count = int(rtrack.max()) + 1 if len(rtrack) else 0
    tlow, thigh = np.full(count, np.iinfo(np.int64).max), np.full(count, np.iinfo(np.int64).min)
    np.minimum.at(tlow, rtrack, time)
    np.maximum.at(thigh, rtrack, time)
    used = thigh >= tlow
    tlow[~used] = 0
    shift = np.zeros(count, dtype=np.int64)
    shift[1:] = np.cumsum(np.where(used, thigh - tlow + 1, 0))[:-1]
    key = time - tlow[rtrack] + shift[rtrack]
    rows = np.argsort(key, kind="stable")
    return order[src[rows]], kind[rows], time[rows], rtrack[rows]


def _interned_names(names: list, track: np.ndarray, code: np.ndarray):
    """InternedData.event_names entries (EventName{iid, name}) for each track's names, built
    column-wise (a run can have a million step names); returns the bytes, grouped by track,
    and per track index the bounds of its entries."""
    count = int(track.max()) + 1 if len(track) else 0
    pairs = np.unique(track.astype(np.int64) * max(len(names), 1) + code)
    ptrack, pcode = pairs // max(len(names), 1), pairs % max(len(names), 1)
    encoded = [s.encode("utf-8") for s in names]
    slen = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    flat = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    soff = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(slen, out=soff[1:])
    iid = (pcode + 1).astype(np.uint64)
    ilen, strlen = _varint_len(iid), slen[pcode]
    lenlen = _varint_len(strlen.astype(np.uint64))
    entry = (1 + ilen + 1 + lenlen + strlen).astype(np.uint64)
    buf, offsets = _pack(len(pairs), [
        (bytes([INT_NAMES << 3 | LEN]), None), (entry, _varint_len(entry), None),
        (bytes([IID << 3]), None), (iid, ilen, None),
        (bytes([IID_NAME << 3 | LEN]), None), (strlen.astype(np.uint64), lenlen, None),
        ((flat, soff[pcode], strlen), None),
    ])
    bounds = offsets[np.searchsorted(ptrack, np.arange(count + 1))]
    return buf, bounds


def write_perfetto(run, path: str, progress: Optional[Callable[[int, int], None]] = None) -> str:
    tracks = _collect(run)
    if progress:
        progress(1, 10)
    cols = tracks.columns
    if cols:
        track, start, end, name, cat, instant = (np.concatenate([c[i] for c in cols]) for i in range(6))
    else:
        track = start = end = name = cat = np.zeros(0, dtype=np.int64)
        instant = np.zeros(0, dtype=bool)
    src, kind, time, rtrack = _ordered(track, start, end, instant)
    if progress:
        progress(4, 10)
    n = len(src)
    first = np.ones(n, dtype=bool)
    first[1:] = rtrack[1:] != rtrack[:-1]
    delta = np.diff(time, prepend=time[:1]).astype(np.uint64)
    delta[first] = 0  # each sequence's clock snapshot is its first time
    seq = (rtrack + 2).astype(np.uint64)  # sequence 1 holds the descriptors
    named = kind != SLICE_END
    name_iid = (name[src] + 1).astype(np.uint64)
    cat_iid = (cat[src] + 1).astype(np.uint64)
    dlen, slen, nlen, clen = _varint_len(delta), _varint_len(seq), _varint_len(name_iid), _varint_len(cat_iid)
    te_len = (2 + np.where(named, 2 + nlen + clen, 0)).astype(np.uint64)
    tlen = _varint_len(te_len)
    pkt_len = (1 + dlen + 1 + slen + 2 + 1 + tlen + te_len.astype(np.int64)).astype(np.uint64)
    buf, offsets = _pack(n, [
        (bytes([TRACE_PACKET << 3 | LEN]), None), (pkt_len, _varint_len(pkt_len), None),
        (bytes([PKT_TIMESTAMP << 3]), None), (delta, dlen, None),
        (bytes([PKT_SEQ_ID << 3]), None), (seq, slen, None),
        (bytes([PKT_SEQ_FLAGS << 3, SEQ_NEEDS_INCREMENTAL_STATE]), None),
        (bytes([PKT_TRACK_EVENT << 3 | LEN]), None), (te_len, tlen, None),
        (bytes([TE_TYPE << 3]), None), (kind.astype(np.uint64), np.ones(n, dtype=np.int64), None),
        (bytes([TE_CATEGORY_IIDS << 3]), named), (cat_iid, clen, named),
        (bytes([TE_NAME_IID << 3]), named), (name_iid, nlen, named),
    ])
    if progress:
        progress(8, 10)
    interned, bounds = _interned_names(list(tracks.names), rtrack[named], name[src[named]])
    categories = b"".join(_msg(INT_CATEGORIES, _int(IID, i + 1), _msg(IID_NAME, c))
                          for i, c in enumerate(tracks.categories))
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], n]
    tmp = f"{path}.tmp{os.getpid()}"
    with files.open_new(tmp, "wb") as f:
        f.write(b"".join(tracks.descriptors))
        for a, b in zip(starts, ends):
            t = int(rtrack[a])
            s = t + 2
            names = interned[bounds[t]:bounds[t + 1]].tobytes()
            t0 = int(time[a])
            head = _packet(_int(PKT_SEQ_ID, s), _int(PKT_SEQ_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED),
                           _msg(PKT_DEFAULTS, _int(DEF_CLOCK_ID, SEQUENCE_CLOCK),
                                _msg(DEF_TRACK_EVENT, _int(TED_TRACK_UUID, tracks.slice_tracks[t]))),
                           _msg(PKT_INTERNED, categories, names))
            head += _packet(_int(PKT_TIMESTAMP, t0), _int(PKT_CLOCK_ID, BOOTTIME), _int(PKT_SEQ_ID, s),
                            _msg(PKT_CLOCK_SNAPSHOT,
                                 _msg(CS_CLOCKS, _int(CLK_ID, BOOTTIME), _int(CLK_TIMESTAMP, t0)),
                                 _msg(CS_CLOCKS, _int(CLK_ID, SEQUENCE_CLOCK), _int(CLK_TIMESTAMP, t0),
                                      _int(CLK_INCREMENTAL, 1))))
            # the sequence in zlib-compressed chunks (TracePacket.compressed_packets = 50), ~1 MiB each
            cuts = np.searchsorted(offsets[a:b + 1], np.arange(offsets[a], offsets[b], CHUNK_BYTES))
            for lo, hi in zip(a + cuts, np.r_[a + cuts[1:], b]):
                raw = buf[offsets[lo]:offsets[hi]].tobytes()
                f.write(_packet(_msg(PKT_COMPRESSED, zlib.compress(head + raw if lo == a else raw, 1))))
    os.replace(tmp, path)
    if progress:
        progress(10, 10)
    return path
