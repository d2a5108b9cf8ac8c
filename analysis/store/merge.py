"""``stepscope merge DIR... -o RUN``: one run from the run folders that the nodes of a
multi-node job wrote on their own disks (docs/design.md, "Many nodes").

Process folders are linked (or copied) into RUN unchanged, except that each
``process.json`` gains ``clock_correction_ns``: what the reader adds to the
process's own wall clock (``realtime - monotonic`` at its anchor) to put it on
the reference rank's clock. Per host, the correction comes from the
``clock.json`` sample with the shortest round trip among that host's ranks
(``integrations/torch/_clocksync.py``); every process of a host shares one
``CLOCK_MONOTONIC``, so one measurement serves them all, DataLoader workers
included. A host with no measurement keeps its own wall clock (NTP) and the
merge says so.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from typing import List, Optional

from stepscope.analysis.store.reader import RunFormatError, left_empty, resolve_run_path
from stepscope.core import files, metadata, runinfo
from stepscope.core.vocabulary import CACHE_DIR, CLOCK_JSON, PROCESS_JSON, RUN_JSON, TRACE_FILE

TOLERANCE_NS = 1_000_000  # the alignment the merge promises; wider bounds are a warning


class MergeError(RunFormatError):
    """Folders that cannot be merged (bad input: the CLI exits 2)."""


def _process_folders(run_dir: str) -> List[str]:
    return sorted(os.path.join(run_dir, d) for d in os.listdir(run_dir)
                  if d != CACHE_DIR and os.path.isdir(os.path.join(run_dir, d))
                  and any(os.path.exists(os.path.join(run_dir, d, f)) for f in (TRACE_FILE, PROCESS_JSON))
                  and not left_empty(os.path.join(run_dir, d)))


def _header_meta(trace: str) -> dict:
    """The trace header's JSON (pid, host, rank, clock) when process.json is lost."""
    try:
        with open(trace, "rb") as f:
            head = f.read(16)
            if len(head) < 16 or head[:8] != b"STEPSCP\n":
                return {}
            (length,) = struct.unpack("<I", head[12:16])
            return json.loads(f.read(length).decode(errors="replace") or "{}")
    except (OSError, ValueError, RecursionError):
        return {}


def _wall_offset(meta: dict) -> int:
    """The anchor alone (reader.wall_offset adds an earlier merge's correction, which this one replaces)."""
    clock = meta.get("clock") or {}
    return int(clock.get("realtime_ns", 0)) - int(clock.get("monotonic_ns", 0))


def _read(folder: str) -> dict:
    meta, notes = metadata.read(os.path.join(folder, PROCESS_JSON), metadata.PROCESS_FIELDS)
    trace = os.path.join(folder, TRACE_FILE)
    header, header_notes = metadata.conform(_header_meta(trace), metadata.PROCESS_FIELDS, f"{trace} (header)")
    for key, value in header.items():
        meta.setdefault(key, value)
    return {"folder": folder, "meta": meta, "host": str(meta.get("host", "")), "notes": notes + header_notes,
            "clock": runinfo.read_json(os.path.join(folder, CLOCK_JSON))}


def host_offsets(procs: List[dict]) -> dict:
    """{host: {"delta_ns", "uncertainty_ns", "via"}}: a host's CLOCK_MONOTONIC plus delta
    is the reference's wall clock."""
    refs = [p for p in procs if p["clock"].get("is_reference")]
    out = {}
    ref_pid = None
    if refs:
        ref = refs[0]
        ref_pid = ref["clock"]["reference"].get("pid")
        out[ref["host"]] = {"delta_ns": int(ref["clock"].get("wall_offset_ns", _wall_offset(ref["meta"]))),
                            "uncertainty_ns": 0, "via": "reference"}
    best = {}
    for p in procs:
        c = p["clock"]
        if c.get("is_reference") or not c.get("samples"):
            continue
        if ref_pid is None:
            ref_pid = c.get("reference", {}).get("pid")
        if c.get("reference", {}).get("pid") != ref_pid:
            continue  # measured against another reference (another process group)
        s = min(c["samples"], key=lambda s: s["rtt_ns"])
        if p["host"] not in best or s["rtt_ns"] < best[p["host"]]["rtt_ns"]:
            best[p["host"]] = s
    for host, s in best.items():
        if host not in out:
            out[host] = {"delta_ns": int(s["ref_wall_ns"]) - int(s["mono_ns"]),
                         "uncertainty_ns": int(s["rtt_ns"]) // 2, "via": "c10d-store"}
    return out


def _link_tree(src: str, dst: str, symlink: bool) -> None:
    files.make_dir(dst)
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if name == PROCESS_JSON or not os.path.isfile(s):
            continue  # process.json is written anew; nothing else is nested
        if symlink:
            os.symlink(os.path.abspath(s), d)
            continue
        try:
            os.link(s, d)  # same file system: no copy of a large trace
        except OSError:
            shutil.copy2(s, d)
            files.narrow(d)


def merge(dirs: List[str], out: str, symlink: bool = False) -> dict:
    """Merges run folders into ``out``; returns ``{"path", "warnings", "alignment"}``."""
    runs = [resolve_run_path(d) for d in dirs]
    if len({os.path.realpath(r) for r in runs}) != len(runs):
        raise MergeError("the same run folder is given twice")
    if os.path.exists(out) and os.listdir(out):
        raise MergeError(f"{out} exists and is not empty")
    procs = [_read(f) for r in runs for f in _process_folders(r)]
    if not procs:
        raise MergeError(f"no process folders in {', '.join(runs)}")
    offsets = host_offsets(procs)
    warnings = [note for p in procs for note in p["notes"]]  # metadata fields of the wrong shape, dropped
    for host in sorted({p["host"] for p in procs} - set(offsets)):
        warnings.append(f"host {host}: no clock offset was recorded (no torch.distributed exchange with rank 0); "
                        "its processes keep their own wall clock (NTP)")
    for host, o in sorted(offsets.items()):
        if o["uncertainty_ns"] > TOLERANCE_NS:
            warnings.append(f"host {host}: clock aligned within {o['uncertainty_ns'] / 1e6:.1f} ms only "
                            "(slow round trips to rank 0's store)")
    files.make_dirs(out)
    skew = {}
    taken = set()
    for p in procs:
        name = os.path.basename(p["folder"])
        base, n = name, 1
        while name in taken:
            name, n = f"{base}.{n}", n + 1
        taken.add(name)
        _link_tree(p["folder"], os.path.join(out, name), symlink)
        meta = dict(p["meta"])
        o = offsets.get(p["host"])
        correction = 0 if o is None else o["delta_ns"] - _wall_offset(meta)
        meta["clock_correction_ns"] = correction
        meta["merged_from"] = os.path.abspath(p["folder"])
        runinfo.write_json_atomic(os.path.join(out, name, PROCESS_JSON), meta)
        skew.setdefault(p["host"], correction)
    info = _run_json(runs, procs, offsets, skew, warnings)
    runinfo.write_json_atomic(os.path.join(out, RUN_JSON), info)
    return {"path": out, "warnings": warnings, "alignment": info["clock_alignment"]}


def _run_json(runs, procs, offsets, skew, warnings) -> dict:
    infos = [(r, metadata.read(os.path.join(r, RUN_JSON), metadata.RUN_FIELDS)[0]) for r in runs]
    ref_host = next((h for h, o in offsets.items() if o["via"] == "reference"), None)
    base = next((i for _, i in infos if i.get("host") == ref_host), None) or next((i for _, i in infos if i), {})
    info = dict(base)

    def corrected(i, key):  # a node's times are on its own wall clock: shift them too
        value = i.get(key)
        return None if not isinstance(value, (int, float)) else value + skew.get(i.get("host"), 0) / 1e9

    starts = [t for _, i in infos if (t := corrected(i, "start_time")) is not None]
    ends = [t for _, i in infos if (t := corrected(i, "end_time")) is not None]
    if starts:
        info["start_time"] = min(starts)
    if ends:
        info["end_time"] = max(ends)
        info["duration_s"] = round(info["end_time"] - info.get("start_time", min(ends)), 6)
    sizes = [i.get("world_size") for _, i in infos] + [p["meta"].get("world_size") for p in procs]
    sizes = [s for s in sizes if isinstance(s, int)]
    ranks = sorted({int(p["meta"]["rank"]) for p in procs if isinstance(p["meta"].get("rank"), int)})
    info["world_size"] = max(sizes) if sizes else (len(ranks) or None)
    info["ranks"] = ranks
    info["hosts"] = sorted({p["host"] for p in procs})
    notes, versions = [], {}
    for _, i in infos:
        notes += [n for n in i.get("notes", []) if n not in notes]
        for k, v in (i.get("versions") or {}).items():
            versions.setdefault(k, v)
    if info["world_size"]:
        missing = sorted(set(range(info["world_size"])) - set(ranks))
        if missing:
            text = (f"{'rank' if len(missing) == 1 else 'ranks'} {', '.join(map(str, missing))} of "
                    f"{info['world_size']} {'is' if len(missing) == 1 else 'are'} missing "
                    "(their node's run folder was not merged)")
            warnings.append(text)
            notes.append(text)
    info["notes"], info["versions"] = notes, versions
    info["merged_from"] = [os.path.abspath(r) for r, _ in infos]
    info["clock_alignment"] = {
        "reference_host": ref_host,
        "tolerance_ns": TOLERANCE_NS,
        "hosts": {h: {"correction_ns": skew.get(h, 0), **offsets[h]} if h in offsets
                  else {"correction_ns": 0, "via": None} for h in sorted({p["host"] for p in procs})},
    }
    return info


def merged_name(dirs: List[str]) -> Optional[str]:
    """The run's name: the nodes of one job agree on it (STEPSCOPE_RUN, TORCHELASTIC_RUN_ID)."""
    names = {os.path.basename(os.path.normpath(resolve_run_path(d))) for d in dirs}
    return names.pop() if len(names) == 1 else None
