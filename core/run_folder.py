"""A run's folders on disk and the metadata a session writes there (core/session.py
runs the session; this module knows the layout).

    <dir>/<run>/run.json            written by the process that created the run
    <dir>/<run>/<host>-rank<N>/     a rank's process folder (torchrun, MPI, SLURM)
    <dir>/<run>/<host>-pid<P>/      any other process: a script, a forked worker
        process.json                who the process is, its clock anchor, stats
        trace.ssc                   the native core's events (docs/format.md)
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import Optional

from stepscope.core import files, runinfo
from stepscope.core.config import Config, run_name_problem, shown
from stepscope.core.recording import clock_info
from stepscope.core.vocabulary import PROCESS_JSON, RUN_JSON, TRACE_FILE


def run_folder(config: Config) -> str:
    """The run's folder: always one folder inside the runs folder, whatever the name's source."""
    root = os.path.abspath(config.dir)
    name = config.name or runinfo.derive_run_name()
    run_dir = os.path.join(root, name)
    problem = run_name_problem(name)
    if problem or os.path.dirname(run_dir) != root:
        raise ValueError(f"the run name {shown(name)} cannot be a folder in {shown(root)} "
                         f"({problem or 'not one folder inside it'})")
    try:
        run_dir.encode("utf-8")
    except UnicodeEncodeError:  # a relative STEPSCOPE_DIR in a working directory with such a name
        raise ValueError(f"the run folder {shown(run_dir)} is not valid UTF-8") from None
    return run_dir


def write_run_json(run_dir: str, config: Config) -> None:
    runinfo.write_json_atomic(os.path.join(run_dir, RUN_JSON), {
        "format": "stepscope-run",
        "version": 1,
        "name": os.path.basename(run_dir),
        "command": list(sys.argv),
        "cwd": os.getcwd(),
        "start_time": time.time(),
        "host": runinfo.hostname(),
        "world_size": runinfo.world_size_from_env(),
        "config": config.as_dict(),
    })


def make_process_dir(run_dir: str, origin: str) -> str:
    host = runinfo.hostname()
    rank = runinfo.current_rank()[0] if origin == "main" else None
    candidates = [f"{host}-rank{rank}"] if rank is not None else []
    candidates.append(f"{host}-pid{os.getpid()}")
    for i, name in enumerate(candidates):
        path = os.path.join(run_dir, name)
        try:
            files.make_dir(path)
            return path
        except FileExistsError:
            if i == len(candidates) - 1:  # our pid folder exists: an earlier session of ours
                for n in range(1, 1000):
                    alt = f"{path}.{n}"
                    try:
                        files.make_dir(alt)
                        return alt
                    except FileExistsError:
                        continue
                raise
    raise RuntimeError("unreachable")


def remove_unstarted(created_run: Optional[str], process_dir: Optional[str]) -> None:
    """Removes the process folder of a session that could not start, and the run folder
    it created if no other process has joined it since."""
    if process_dir is not None:
        shutil.rmtree(process_dir, ignore_errors=True)
    if created_run is None:
        return
    try:
        leftovers = os.listdir(created_run)
        if any(not (f == RUN_JSON or f.startswith(f"{RUN_JSON}.tmp")) for f in leftovers):
            return  # another process has joined the run: it keeps run.json
        for f in leftovers:
            os.unlink(os.path.join(created_run, f))
        os.rmdir(created_run)
    except OSError:
        pass


def has_siblings(run_dir: str, process_dir: str) -> bool:
    """Whether another process has a folder in the run."""
    try:
        return any(os.path.isdir(os.path.join(run_dir, d)) and d != os.path.basename(process_dir)
                   for d in os.listdir(run_dir))
    except OSError:
        return False


# --- process.json and run.json's end -------------------------------------------------------
def process_json(origin: str, parent: Optional[str], start_wall: float) -> dict:
    """process.json as the session starts: who the process is, its clock."""
    rank, world_size = runinfo.current_rank()
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": runinfo.hostname(),
        "rank": rank if origin == "main" else None,
        "parent_rank": rank,
        "local_rank": _int_env("LOCAL_RANK"),
        "world_size": world_size,
        "origin": origin,
        "parent": parent,
        "argv": list(sys.argv),
        "start_time": start_wall,
        "process_start_time": runinfo.process_start_time(),
        "clock": {**runinfo.clock_anchor(), **clock_info()},
        "trace": TRACE_FILE,
    }


def finish_process_json(run_dir: str, process_dir: str, origin: str, stats: dict) -> dict:
    """Completes process.json as the session ends (and run.json's list of ranks); returns it."""
    path = os.path.join(process_dir, PROCESS_JSON)
    meta = runinfo.read_json(path)
    meta["end_time"] = time.time()
    if origin == "main" and meta.get("rank") is None:  # learnt since the start
        meta["rank"], meta["world_size"] = runinfo.current_rank()
    elif meta.get("rank") is None:
        # A spawned child that joined a process group itself (torch.multiprocessing.spawn
        # with no RANK in the environment) is a rank, not a helper.
        found = runinfo.rank_from_providers()
        if found is not None:
            meta["rank"], meta["world_size"] = found
    if origin == "main" or meta.get("rank") is not None:
        runinfo.record_process(os.path.join(run_dir, RUN_JSON), meta["host"], meta.get("rank"),
                               meta.get("world_size"))
    meta["threads"] = {str(t.native_id): t.name for t in threading.enumerate()
                       if t.native_id is not None}
    meta["stats"] = {k: stats.get(k) for k in ("written", "dropped", "bytes", "names_folded", "error")}
    meta["versions"] = runinfo.framework_versions()
    runinfo.write_json_atomic(path, meta)
    return meta


def finish_run_json(run_dir: str, start_wall: float, end_time: float, versions: dict) -> None:
    def update(info):
        info["end_time"] = end_time
        info["duration_s"] = round(end_time - start_wall, 6)
        info.setdefault("versions", {}).update(versions)

    runinfo.update_json_locked(os.path.join(run_dir, RUN_JSON), update)


def _int_env(var: str) -> Optional[int]:
    v = os.environ.get(var, "").strip()
    return int(v) if v.isdigit() else None
