"""System metrics for a session: the native sampler, one node sampler per host
(elected by a lock on the run folder), and NVML/CUPTI through ``core.gpu``."""

from __future__ import annotations

import os

from stepscope.core import _native, files, gpu, runinfo
from stepscope.core.vocabulary import PROCESS_JSON, RUN_JSON, node_lock_file


def _elect_node_sampler(session) -> bool:
    """One process per host samples the host's metrics: the first to lock
    ``<run>/.node-<host>.lock`` (ranks start together; any rank will do). The
    others record which process folder holds the samples."""
    import fcntl

    path = os.path.join(session.run_dir, node_lock_file(runinfo.hostname()))
    f = open(path, "a+", opener=lambda p, flags: os.open(p, flags, files.FILE_MODE))
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        session.node_sampler = f.read().strip() or None
        f.close()
        return False
    f.seek(0)
    f.truncate()
    f.write(os.path.basename(session.process_dir))
    f.flush()
    session._node_lock = f
    session.node_sampler = os.path.basename(session.process_dir)
    return True


def start_sampling(session, config, origin: str) -> None:
    """System metrics: never fatal; what cannot be measured is noted in run.json."""
    try:
        # Helpers (forked/spawned workers) are sampled by the process that started them.
        node = origin == "main" and _elect_node_sampler(session)
        notes = list(_native.start_sampler(config.interval_ms, node, origin == "main"))
    except Exception as exc:  # noqa: BLE001
        node, notes = False, [f"system metrics off: {type(exc).__name__}: {exc}"]
    try:
        notes += gpu.start(config, node, origin == "main", session.run_dir)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"GPU: off ({type(exc).__name__}: {exc})")
    meta_path = os.path.join(session.process_dir, PROCESS_JSON)
    meta = runinfo.read_json(meta_path)
    meta["node_sampler"] = session.node_sampler
    meta["notes"] = notes
    runinfo.write_json_atomic(meta_path, meta)
    if notes:
        host = runinfo.hostname()
        runinfo.update_json_locked(os.path.join(session.run_dir, RUN_JSON), lambda info: info.setdefault(
            "notes", []).extend(f"{host}: {n}" for n in notes if f"{host}: {n}" not in info.get("notes", [])))
