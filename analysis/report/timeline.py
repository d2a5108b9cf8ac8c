"""The report's timeline data: the run as compact columns for the in-page canvas viewer.

Tracks form a tree: host -> process (rank) -> the steps track, one track per
thread (spans nested by depth: phases, annotations, modules, ops), and per
GPU device one track per stream with its kernels. Every span is an *item* of
one row (a track at one nesting depth); items are stored row by row in start
order as typed arrays, gzip-compressed and base64-encoded: start as the gap from the previous
item's start in the row (uint32 ns), duration (uint32 ns; larger values go to
an overflow list), an interned name, a category, an integer argument.

The page holds a bounded number of items whatever the run's length
(timeline_detail.py): every span of a few steps chosen for meaning, step-level
coverage bars (count and busy fraction kept) for the rest. The page says so and
points to the Perfetto export for every event. The viewer itself merges
whatever is narrower than a pixel as it draws, so the bound is about the
file's size, not drawing speed.
"""

from __future__ import annotations

import base64
import gzip
import json

import numpy as np
import pandas as pd

from stepscope.analysis.gpu_activity import device_operations, host_launches
from stepscope.analysis.rules.gpudata import steps_by_process
from stepscope.analysis.store.frames import as_strings, split
from stepscope.analysis.report.timeline_detail import (DETAIL_ITEMS, OVERVIEW_ITEMS, REQUESTED_ITEMS, choose_steps,
                                                       chosen_ids, phase_sample, reduce_items, sampled_steps)

NAME_CHARS = 300  # longer names (templated kernels) are cut in the page; the exports keep them whole
MAX_FLOWS = 10_000  # launch arrows
MIXED = "(several names)"
U32_MAX = 0xFFFFFFFF


def _depths(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting depth of each span on its thread (threads as small integer codes). Spans come
    in start order per thread (parents first); a span's depth is the number of earlier
    spans of its thread still open when it starts."""
    depth = np.zeros(len(start), dtype=np.int64)
    if len(start) < 2:
        return depth
    if thread.max() == thread.min():
        groups = [slice(None)]  # one thread: views, no copies
    else:  # a stable radix sort on small codes keeps each thread's start order
        order = np.argsort(thread.astype(np.uint16) if thread.max() < 65536 else thread, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(thread[order])) + 1)
    for idx in groups:
        s, e = start[idx], end[idx]
        if not np.any(s[1:] < e[:-1]):
            continue  # nothing nests: the common case for phase-only threads
        e = np.maximum(e, s + 1)
        closed = np.searchsorted(np.sort(e), s, side="right")
        depth[idx] = np.maximum(np.arange(len(s)) - closed, 0)
    return depth


class _Builder:
    """Collects rows and items, then lays them out as the page's columns."""

    def __init__(self, names: list, cats: list):
        self.names = list(names)
        self.name_ids = {n: i for i, n in enumerate(self.names)}
        self.cats = list(cats)
        self.nodes: list = []
        self.parts: list = []  # (row ids, start, end, name, cat, arg)
        self.n_rows = 0
        self.pnodes: dict = {}  # process name -> its node

    def name(self, text: str) -> int:
        if text not in self.name_ids:
            self.name_ids[text] = len(self.names)
            self.names.append(text)
        return self.name_ids[text]

    def cat(self, text: str) -> int:
        if text not in self.cats:
            self.cats.append(text)
        return self.cats.index(text)

    def node(self, label: str, kind: str, parent: int, rows: int = 0, process: int = -1) -> int:
        row_ids = list(range(self.n_rows, self.n_rows + rows))
        self.n_rows += rows
        self.nodes.append({"label": label, "kind": kind, "parent": parent, "rows": row_ids, "process": process})
        return len(self.nodes) - 1

    def add(self, rows, start, end, name, cat, arg) -> None:
        if len(rows):
            arg = np.clip(np.asarray(arg, np.int64), -2**31, 2**31 - 1)
            self.parts.append((np.asarray(rows, np.int32), np.asarray(start, np.int64), np.asarray(end, np.int64),
                               np.asarray(name, np.int32), np.asarray(cat, np.uint8), arg.astype(np.int32)))


def _cpu_tracks(b: _Builder, ev: pd.DataFrame, procs: pd.DataFrame, steps: pd.DataFrame, kernels: pd.DataFrame,
                launches: pd.DataFrame, base: int) -> None:
    spans = (ev["kind"].cat.codes.to_numpy() == 0)
    rows_ev = np.flatnonzero(spans)
    pcode = ev["process"].cat.codes.to_numpy()[rows_ev].astype(np.int64)
    tid = ev["tid"].to_numpy()[rows_ev].astype(np.int64)
    start = ev["start_ns"].to_numpy()[rows_ev] - base
    end = ev["end_ns"].to_numpy()[rows_ev] - base
    names = ev["name"].cat.codes.to_numpy()[rows_ev]
    cats = ev["category"].cat.codes.to_numpy()[rows_ev]
    args = ev["arg"].to_numpy()[rows_ev]
    if "op" in ev["category"].cat.categories:  # an op span's arg packs two numbers: show torch's sequence number
        is_op = cats == ev["category"].cat.categories.get_loc("op")
        if is_op.any():
            args = args.copy()
            args[is_op] = (np.maximum(args[is_op], 0) & 0xFFFFFFFF) - 1
    thread_of, threads = pd.factorize((pcode << 32) | (tid & U32_MAX))
    depth = _depths(thread_of, start, end)
    max_depth = pd.Series(depth).groupby(thread_of).max().reindex(range(len(threads)), fill_value=0).to_numpy()
    first_start = pd.Series(start).groupby(thread_of).min().reindex(range(len(threads)), fill_value=0).to_numpy()
    thread_row = np.zeros(len(threads), dtype=np.int64)  # row id of each thread's depth 0
    if len(pcode) and np.any(pcode[1:] < pcode[:-1]):  # processes are contiguous in the events table
        by_process = np.argsort(pcode, kind="stable")
    else:
        by_process = None
    bounds = np.searchsorted(pcode if by_process is None else pcode[by_process],
                             np.arange(len(ev["process"].cat.categories) + 1))

    # a thread with nothing but collectives in flight is the backend's (gloo's, NCCL's watchdog)
    comm_only = np.zeros(len(threads), dtype=bool)
    if "comm" in ev["category"].cat.categories and len(thread_of):
        is_comm = cats == ev["category"].cat.categories.get_loc("comm")
        comm_only = (np.bincount(thread_of, weights=~is_comm, minlength=len(threads)) == 0)
    process_names = list(ev["process"].cat.categories)
    info = {p["process"]: p for _, p in procs.iterrows()}
    in_process = {name: [] for name in process_names}
    for i, key in enumerate(threads):
        in_process[process_names[key >> 32]].append(i)
    def per_process(frame):
        return {str(k): g for k, g in split(frame, "process")} if len(frame) else {}

    step_proc, kern_proc, launch_proc = per_process(steps), per_process(kernels), per_process(launches)
    hosts: dict = {}
    order = sorted(set(process_names) | set(step_proc) | set(kern_proc) | set(launch_proc),
                   key=lambda p: (str(info.get(p, {}).get("host", "")), p))
    step_cat = b.cat("step")
    for process in order:
        meta = info.get(process, {})
        host = str(meta.get("host", "") or "host")
        if host not in hosts:
            hosts[host] = b.node(host, "host", -1)
        rank = meta.get("rank")
        label = process if rank is None or rank != rank else f"{process} (rank {int(rank)})"
        pnode = b.node(label, "process", hosts[host])
        b.nodes[pnode]["process"] = pnode
        b.pnodes[process] = pnode
        if process in step_proc:
            node = b.node("steps", "steps", pnode, 1, pnode)
            s = step_proc[process]
            row = b.nodes[node]["rows"][0]
            modes = s["mode"] if isinstance(s["mode"].dtype, pd.CategoricalDtype) else s["mode"].astype("category")
            mode_ids = np.array([b.name(str(m)) for m in modes.cat.categories], dtype=np.int64)
            b.add(np.full(len(s), row), s["start_ns"].to_numpy() - base, s["end_ns"].to_numpy() - base,
                  mode_ids[modes.cat.codes.to_numpy()], np.full(len(s), step_cat), s["step"].to_numpy())
        pid = meta.get("pid")
        for i in sorted(in_process.get(process, []), key=lambda i: (int(threads[i] & U32_MAX) != pid, first_start[i])):
            tid_i = int(threads[i] & U32_MAX)
            label = (f"main thread {tid_i}" if tid_i == pid else f"collectives in flight (thread {tid_i})"
                     if comm_only[i] else f"thread {tid_i}")
            node = b.node(label, "thread", pnode, int(max_depth[i]) + 1, pnode)
            thread_row[i] = b.nodes[node]["rows"][0]
        if process in process_names:  # this process's spans, rows in order, each in start order
            code = process_names.index(process)
            sel = slice(bounds[code], bounds[code + 1])
            sel = sel if by_process is None else by_process[sel]
            rows = thread_row[thread_of[sel]] + depth[sel]
            if np.any(rows[1:] < rows[:-1]):
                sel = np.arange(len(pcode))[sel][np.argsort(rows, kind="stable")]
                rows = thread_row[thread_of[sel]] + depth[sel]
            b.add(rows, start[sel], end[sel], names[sel], cats[sel], args[sel])
        if process in launch_proc:
            _launch_tracks(b, launch_proc[process], pnode, base)
        if process in kern_proc:
            _gpu_tracks(b, kern_proc[process], pnode, base)


def _nested_track(b: _Builder, label: str, kind: str, parent: int, process: int, frame: pd.DataFrame, base: int,
                  names, cats, args) -> None:
    """A track of spans (frame in start order), rows by nesting depth."""
    start = frame["start_ns"].to_numpy().astype(np.int64) - base
    end = frame["end_ns"].to_numpy().astype(np.int64) - base
    depth = _depths(np.zeros(len(frame), dtype=np.int64), start, end)
    node = b.node(label, kind, parent, int(depth.max()) + 1 if len(depth) else 1, process)
    by_row = np.argsort(depth, kind="stable")  # parts come in row order
    b.add(b.nodes[node]["rows"][0] + depth[by_row], start[by_row], end[by_row], np.asarray(names)[by_row],
          np.asarray(cats)[by_row], np.asarray(args)[by_row])


def _launch_tracks(b: _Builder, calls: pd.DataFrame, pnode: int, base: int) -> None:
    """CUDA runtime/driver calls, a track per host thread; their argument is the correlation id."""
    cat = b.cat("cuda_runtime")
    for thread, t in calls.groupby("thread", sort=True):
        _nested_track(b, f"CUDA API, thread {thread}", "thread", pnode, pnode, t, base,
                      _ids(b.name, t["name"]), np.full(len(t), cat), t["correlation"].to_numpy())


def _gpu_tracks(b: _Builder, ops: pd.DataFrame, pnode: int, base: int) -> None:
    """Per device a node, per stream a track of its kernels, copies, memsets and syncs."""
    for dev, on_dev in ops.groupby("device", sort=True):
        gnode = b.node(f"GPU {dev}", "gpu", pnode, 0, pnode)
        for stream, t in on_dev.groupby("stream", sort=True):
            label = "context (all streams)" if stream < 0 else f"stream {stream}"
            _nested_track(b, label, "stream", gnode, pnode, t, base, _ids(b.name, t["name"]),
                          _ids(b.cat, t["kind"]), t["correlation"].to_numpy())


def _ids(intern, column: pd.Series) -> np.ndarray:
    """intern(value) of every value, called once per distinct value (millions of kernels,
    a few hundred names)."""
    codes, uniques = pd.factorize(column, sort=False)
    ids = np.array([intern(str(u)) for u in uniques], dtype=np.int64)
    return ids[codes] if len(ids) else np.zeros(len(codes), dtype=np.int64)


def _b64(a: np.ndarray) -> str:
    """gzip, then base64: the page inflates it with the browser's DecompressionStream. The
    columns compress 3-5x (gaps and durations repeat from step to step, names and categories
    are runs), which is most of the page beside plotly.js (BENCHMARKS.md, report_size)."""
    return base64.b64encode(gzip.compress(np.ascontiguousarray(a).tobytes(), compresslevel=6, mtime=0)).decode("ascii")


def _process_steps(b: _Builder, steps: pd.DataFrame, base: int) -> dict:
    """{process node: its steps on the timeline's clock}; a process without steps of its own
    (a DataLoader worker) is cut at the steps of the process with the most."""
    if steps.empty:
        return {}
    columns = ["process", "mode", "step", "start_ns", "end_ns"]
    s = pd.DataFrame({"process": steps["process"].array, "mode": steps["mode"].array, "step": steps["step"].array,
                      "start_ns": steps["start_ns"].to_numpy() - base, "end_ns": steps["end_ns"].to_numpy() - base},
                     index=steps.index, copy=False)  # (only the times are new arrays: a run has millions of steps)
    own = {str(k): g for k, g in steps_by_process(s, columns).items()}
    ref = max(own.values(), key=len)
    return {node: own.get(name, ref) for name, node in b.pnodes.items()}


def _short_names(names: list, used: np.ndarray):
    """Only the names the kept items use (kernel names can be kilobytes), each at most NAME_CHARS."""
    keep = np.unique(used)
    table = [n if len(n) <= NAME_CHARS else n[:NAME_CHARS - 1] + "\u2026" for n in (names[i] for i in keep)]
    return table, np.searchsorted(keep, used)


def timeline_data(run, findings=(), steps_asked=None) -> dict:
    """The payload the page's viewer reads (see the module docstring), or None for an empty run.
    findings: the summary's (the steps they name keep full detail); steps_asked: [(first, last)]."""
    steps = run.steps
    ops = getattr(run, "ops", ())  # the steps of operator windows show their ops in detail
    sampled = ops.loc[ops["step"] >= 0, ["mode", "step"]].drop_duplicates().itertuples(index=False) if len(ops) else ()
    chosen = choose_steps(steps, findings, steps_asked, sampled)
    if getattr(run, "large", False):  # GPU rows too: only the chosen steps' operations are read
        windows = _detail_windows(steps, chosen)
        ev = _large_run_events(run, windows)
        kernels, launches = device_operations(run, during=windows), host_launches(run, during=windows)
    else:
        ev = run.events
        kernels, launches = device_operations(run), host_launches(run)
    if not len(ev) and not len(steps):
        return None
    starts = [int(ev["start_ns"].min())] if len(ev) else []
    if len(steps):
        starts.append(int(steps["start_ns"].min()))
    if len(kernels):
        starts.append(int(kernels["start_ns"].min()))
    base = min(starts)
    b = _Builder([str(n) for n in ev["name"].cat.categories], [str(c) for c in ev["category"].cat.categories])
    _cpu_tracks(b, ev, run.processes, steps, kernels, launches, base)
    if b.parts:
        row, start, end, name, cat, arg = (np.concatenate(c) for c in zip(*b.parts))
    else:
        row = start = end = name = cat = arg = np.zeros(0, dtype=np.int64)
    if np.any(row[1:] < row[:-1]):  # parts come in row order; kept for safety
        order = np.argsort(row, kind="stable")
        row, start, end, name, cat, arg = row[order], start[order], end[order], name[order], cat[order], arg[order]
    end = np.maximum(end, start)
    row_process = np.full(max(b.n_rows, 1), -1, dtype=np.int64)
    row_device = np.zeros(max(b.n_rows, 1), dtype=bool)
    for node in b.nodes:
        row_process[node["rows"]] = node["process"]
        row_device[node["rows"]] = node["kind"] == "stream"
    detail_cap = REQUESTED_ITEMS if steps_asked else DETAIL_ITEMS
    (row, start, end, name, cat, arg, count, fill), done = reduce_items(
        (row, start, end, name, cat, arg), row_process, row_device, _process_steps(b, steps, base), chosen,
        b.name(MIXED), detail_cap, OVERVIEW_ITEMS)
    names, name = _short_names(b.names, name)
    n = len(row)
    row_off = np.searchsorted(row, np.arange(b.n_rows), side="left")
    row_len = np.diff(np.append(row_off, n))
    gap = np.diff(start, prepend=0)
    gap[row_off[row_len > 0]] = start[row_off[row_len > 0]]  # each row starts from the base
    dur = end - start
    over_gap, over_dur = gap >= U32_MAX, dur >= U32_MAX
    name_u16 = len(names) < 65536
    arrays = {"start": _b64(np.where(over_gap, U32_MAX, gap).astype("<u4")),
              "dur": _b64(np.where(over_dur, U32_MAX, dur).astype("<u4")),
              "name": _b64(name.astype("<u2" if name_u16 else "<u4")),
              "cat": _b64(cat.astype(np.uint8)),
              "arg": _b64(arg.astype("<i4"))}
    if done["merged"]:
        arrays["count"] = _b64(np.minimum(count, U32_MAX).astype("<u4"))
        arrays["fill"] = _b64(fill)
    duration = int(end.max()) if n else 0
    if getattr(run, "large", False):
        done["phases_only_outside_detail"] = True
        done["overview_phase_steps_every"] = phase_sample(run)
    meta = {"items": n, "base_epoch_ns": str(base), "duration_ns": duration, **done, "detail_steps": chosen,
            "names": names, "cats": b.cats, "name_u16": name_u16, "nodes": b.nodes,
            "row_off": row_off.tolist(), "row_len": row_len.tolist(),
            "overflow_start": gap[over_gap].tolist(), "overflow_dur": dur[over_dur].tolist(),
            "flows": _flows(b, row, start, name, cat, arg, count if done["merged"] else None)}
    return {"meta": meta, "arrays": arrays}


def _detail_windows(steps: pd.DataFrame, chosen: list) -> list:
    """[(start_ns, end_ns)] of the chosen steps, overlapping ones joined."""
    mine = chosen_ids(steps, chosen) >= 0
    return _merged(steps["start_ns"].to_numpy()[mine], steps["end_ns"].to_numpy()[mine])


def _large_run_events(run, windows: list) -> pd.DataFrame:
    """A large run's spans for the timeline, without its events table: every span of
    the chosen steps (the time filter pushed into the dataset's scan), and elsewhere
    the phases only (from the phases table): the coverage bars of the rest of the
    run show where phases ran, not every annotation, module, op or GPU operation."""
    from stepscope.core.vocabulary import EVENT_KINDS

    columns = ["process", "tid", "kind", "category", "name", "start_ns", "end_ns", "arg"]
    detail = run.select(kinds=["span"], during=windows, columns=columns)
    ph = run.select_phases(steps=sampled_steps(run), columns=["process", "tid", "name", "start_ns", "end_ns"])
    if len(windows) and len(ph):
        lo, hi = np.array([w[0] for w in windows]), np.array([w[1] for w in windows])
        at = np.searchsorted(lo, ph["end_ns"].to_numpy(), side="left") - 1  # the last window starting before its end
        inside = (at >= 0) & (hi[np.maximum(at, 0)] > ph["start_ns"].to_numpy())
        ph = ph[~inside]
    phases = pd.DataFrame({"process": as_strings(ph["process"]), "tid": ph["tid"].to_numpy(np.int64),
                           "kind": "span", "category": "phase", "name": as_strings(ph["name"]),
                           "start_ns": ph["start_ns"].to_numpy(np.int64), "end_ns": ph["end_ns"].to_numpy(np.int64),
                           "arg": np.int64(-1)})
    ev = pd.concat([detail[columns].astype({c: str for c in ("process", "kind", "category", "name")}), phases],
                   ignore_index=True)
    ev = ev.sort_values(["process", "start_ns"], kind="stable", ignore_index=True)
    for c in ("process", "category", "name"):
        ev[c] = ev[c].astype("category")
    ev["kind"] = pd.Categorical(ev["kind"], categories=list(EVENT_KINDS))
    return ev


def _merged(starts: np.ndarray, ends: np.ndarray) -> list:
    """[(start, end)] sorted, overlapping ones joined."""
    out: list = []
    for t0, t1 in sorted(zip(starts.tolist(), ends.tolist())):
        if out and t0 <= out[-1][1]:
            out[-1][1] = max(out[-1][1], t1)
        else:
            out.append([t0, t1])
    return [(a, b) for a, b in out]


def _flows(b, row, start, name, cat, arg, count) -> list:
    """[launch item, device item] pairs: a CUDA call and the GPU operation of the same
    correlation id in one process, both kept whole in the page."""
    kernel_rows = {r for n in b.nodes if n["kind"] == "stream" for r in n["rows"]}
    if not kernel_rows:
        return []
    process_of_row = np.full(b.n_rows, -1, dtype=np.int64)
    for n in b.nodes:
        for r in n["rows"]:
            process_of_row[r] = n["process"]
    whole = count == 1 if count is not None else np.ones(len(row), dtype=bool)
    is_kernel = np.isin(row, list(kernel_rows))
    kern = np.flatnonzero(is_kernel & whole & (arg > 0))
    launch_cats = [i for i, c in enumerate(b.cats) if c == "cuda_runtime"]
    launch = np.flatnonzero(~is_kernel & whole & (arg > 0) & np.isin(cat, launch_cats))
    if not len(kern) or not len(launch):
        return []
    key = lambda i: (process_of_row[row[i]] << 32) | (arg[i].astype(np.int64) & U32_MAX)  # noqa: E731
    by_key = dict(zip(key(launch).tolist(), launch.tolist()))
    return [[by_key[k], int(i)] for k, i in zip(key(kern).tolist(), kern) if k in by_key][:MAX_FLOWS]


def script_json(payload) -> str:
    """JSON safe inside <script>: no `</`, `<!--` or `-->` can appear."""
    return json.dumps(payload, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")
