"""The profiling session: one per process, writing one trace into a run folder.

    <dir>/<run>/run.json            written by the process that created the run
    <dir>/<run>/<host>-rank<N>/     a rank's process folder (torchrun, MPI, SLURM)
    <dir>/<run>/<host>-pid<P>/      any other process: a script, a forked worker
        process.json                who the process is, its clock anchor, stats
        trace.ssc                   the native core's events (docs/format.md)

Forked and spawned children (DataLoader workers) join with folders of their own.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import threading
import time
from typing import Optional

from stepscope.core import _native, annotations, files, gpu, runinfo, safety
from stepscope.core.vocabulary import PROCESS_JSON, RUN_JSON, TRACE_FILE
from stepscope.core.config import Config, native_settings, resolve, run_name_problem, shown
from stepscope.core.sampling import start_sampling

__all__ = ["Session", "start", "stop", "current", "profile"]

# Exported to child processes so that spawned children join the same run.
_ACTIVE_RUN_VAR = "STEPSCOPE_ACTIVE_RUN"
_PARENT_RANK_VAR = "STEPSCOPE_PARENT_RANK"
_PARENT_PROCESS_VAR = "STEPSCOPE_PARENT_PROCESS"  # the process folder of the parent: a spawned helper's owner
_OWNER_VAR = "STEPSCOPE_ACTIVE_OWNER"  # runinfo.process_token() of the process recording the active run

_lock = threading.RLock()
_session: Optional["Session"] = None
_stopping: Optional["Session"] = None  # the session whose stop callbacks run now
_loader = None  # stepscope.load, set by the package's front file (set_loader)
_stop_callbacks: list = []  # integrations close their open steps before the trace ends


def set_loader(load) -> None:
    """What Session.load() reads a run with (the package's front file hands stepscope.load)."""
    global _loader
    _loader = load


def on_stop(callback) -> None:
    """Registers callback() to run when a session stops, before the trace is closed."""
    if callback not in _stop_callbacks:
        _stop_callbacks.append(callback)


def add_note(text: str) -> None:
    """Adds one line to run.json's notes (what was not measured, and why); once per text."""
    s = _session or _stopping
    if s is None or not (s.active or s is _stopping):
        return
    try:
        runinfo.update_json_locked(os.path.join(s.run_dir, RUN_JSON), lambda info: (
            None if text in info.get("notes", []) else info.setdefault("notes", []).append(text)))
    except Exception:  # noqa: BLE001 - a note is never worth breaking the job
        pass


class Session:
    """A running (or finished) profile of this process. ``stop()`` ends it."""

    def __init__(self, config: Config, run_dir: str, process_dir: str, created_run: bool,
                 origin: str, parent: Optional[str] = None):
        self.config = config
        self.run_dir = run_dir
        self.process_dir = process_dir
        self.name = os.path.basename(run_dir)
        self.created_run = created_run
        self.origin = origin  # "main", "fork" or "spawn"
        self.parent = parent
        self.active = False
        self.stats: dict = {}
        self.node_sampler: Optional[str] = None  # process folder that samples this host
        self._node_lock = None
        self._start_wall = time.time()

    @property
    def path(self) -> str:
        return self.run_dir

    def __repr__(self) -> str:
        state = "recording" if self.active else "stopped"
        return f"<stepscope.Session {self.run_dir!r} {state}>"

    # with stepscope.profile(...) as run: ...
    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Flushes and closes the trace. Safe to call more than once."""
        global _session, _stopping
        with _lock:
            if not self.active:
                return
            self.active = False
            if _session is self:
                _session = None
                if os.environ.get(_ACTIVE_RUN_VAR) == self.run_dir:
                    del os.environ[_ACTIVE_RUN_VAR]
                    os.environ.pop(_OWNER_VAR, None)
        try:
            _native.stop_sampler()
            _native.pysampler_stop()  # joins with the GIL released
        except Exception:  # noqa: BLE001
            pass
        if self._node_lock is not None:
            try:  # the election file goes with the election: a finished run holds only data
                os.unlink(self._node_lock.name)
            except OSError:
                pass
            self._node_lock.close()  # releases the host's sampler election
            self._node_lock = None
        _stopping = self  # the callbacks may still add notes (what the last steps showed)
        for callback in list(_stop_callbacks):
            try:
                callback()
            except Exception as exc:  # noqa: BLE001
                safety.report_failure("closing the last step failed", exc)
        _stopping = None
        try:
            gpu.stop()  # CUPTI's last buffers reach the trace before it closes
        except Exception:  # noqa: BLE001
            pass
        try:
            _native.close()
            self.stats = _native.stats()
            if not self.stats.get("written") and not self.stats.get("dropped") and self._has_siblings():
                # A process that recorded nothing (most DataLoader workers, a torchrun
                # agent) leaves no folder beside the ones that did.
                shutil.rmtree(self.process_dir, ignore_errors=True)
                if self.created_run:
                    self._finish_run_json(time.time(), runinfo.framework_versions())
                return
            self._finish_metadata()
        except Exception as exc:  # noqa: BLE001
            safety.report_failure(f"finishing the run in {self.process_dir} failed", exc)

    def load(self):
        """The recorded run as tables (see stepscope.load)."""
        if _loader is None:  # (stepscope/__init__.py sets it: core itself knows no analysis)
            raise RuntimeError("no run loader: call stepscope.load(path)")
        return _loader(self.run_dir)

    # --- metadata -----------------------------------------------------------------
    def _process_json(self) -> dict:
        rank, world_size = runinfo.current_rank()
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "host": runinfo.hostname(),
            "rank": rank if self.origin == "main" else None,
            "parent_rank": rank,
            "local_rank": _int_env("LOCAL_RANK"),
            "world_size": world_size,
            "origin": self.origin,
            "parent": self.parent,
            "argv": list(sys.argv),
            "start_time": self._start_wall,
            "process_start_time": runinfo.process_start_time(),
            "clock": {**runinfo.clock_anchor(), **_native.clock_info()},
            "trace": TRACE_FILE,
        }

    def _finish_metadata(self) -> None:
        path = os.path.join(self.process_dir, PROCESS_JSON)
        meta = runinfo.read_json(path)
        meta["end_time"] = time.time()
        if self.origin == "main" and meta.get("rank") is None:  # learnt since the start
            meta["rank"], meta["world_size"] = runinfo.current_rank()
        elif meta.get("rank") is None:
            # A spawned child that joined a process group itself (torch.multiprocessing.spawn
            # with no RANK in the environment) is a rank, not a helper.
            found = runinfo.rank_from_providers()
            if found is not None:
                meta["rank"], meta["world_size"] = found
        if self.origin == "main" or meta.get("rank") is not None:
            runinfo.record_process(os.path.join(self.run_dir, RUN_JSON), meta["host"], meta.get("rank"),
                                   meta.get("world_size"))
        meta["threads"] = {str(t.native_id): t.name for t in threading.enumerate()
                           if t.native_id is not None}
        meta["stats"] = {k: self.stats.get(k) for k in ("written", "dropped", "bytes", "names_folded", "error")}
        meta["versions"] = runinfo.framework_versions()
        runinfo.write_json_atomic(path, meta)
        if self.created_run:
            self._finish_run_json(meta["end_time"], meta["versions"])

    def _finish_run_json(self, end_time: float, versions: dict) -> None:
        def update(info):
            info["end_time"] = end_time
            info["duration_s"] = round(end_time - self._start_wall, 6)
            info.setdefault("versions", {}).update(versions)

        runinfo.update_json_locked(os.path.join(self.run_dir, RUN_JSON), update)

    def _has_siblings(self) -> bool:
        try:
            return any(os.path.isdir(os.path.join(self.run_dir, d)) and d != os.path.basename(self.process_dir)
                       for d in os.listdir(self.run_dir))
        except OSError:
            return False


def _int_env(var: str) -> Optional[int]:
    v = os.environ.get(var, "").strip()
    return int(v) if v.isdigit() else None


def _make_process_dir(run_dir: str, origin: str) -> str:
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


def _write_run_json(run_dir: str, config: Config) -> None:
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


def _open(config: Config, run_dir: str, origin: str, parent: Optional[str]) -> Session:
    """Creates the folders and metadata and starts the native writer; raises on failure."""
    files.make_dirs(os.path.dirname(run_dir) or ".")
    created = False
    try:
        files.make_dir(run_dir)
        created = True
    except FileExistsError:
        pass
    process_dir = None
    try:
        if created:
            _write_run_json(run_dir, config)
        process_dir = _make_process_dir(run_dir, origin)
        session = Session(config, run_dir, process_dir, created, origin, parent)
        meta = session._process_json()
        runinfo.write_json_atomic(os.path.join(process_dir, PROCESS_JSON), meta)
        if origin == "main":  # a rank killed before its end is still counted (world size, ranks)
            runinfo.record_process(os.path.join(run_dir, RUN_JSON), meta["host"], meta["rank"], meta["world_size"])
        header = json.dumps({"pid": meta["pid"], "host": meta["host"], "rank": meta["rank"],
                             "clock": meta["clock"]})
        err = _native.open(os.path.join(process_dir, TRACE_FILE), header,
                           config.flush_interval_ms, config.buffer_mb << 20,
                           config.disk_floor_mb << 20, config.disk_floor_pct / 100)
        if err:
            raise OSError(err)
    except BaseException:
        _remove_unstarted(run_dir if created else None, process_dir)  # a failed start leaves nothing
        raise
    session.active = True
    _native.configure(**native_settings(clock=False))  # the samplers' variables, read at each start
    start_sampling(session, config, origin)
    if config.pysample_hz and (origin == "main" or _reads_frames()):
        # helpers (DataLoader workers) only with the frame reader: the GIL walk would make them wait
        _start_pysampler(config.pysample_hz)
    return session


def _reads_frames() -> bool:
    """Whether the Python sampler reads frames without the GIL here (csrc/record/pyframes.cc)."""
    try:
        return _native.pysampler_status()["method"] == "frames"
    except Exception:  # noqa: BLE001
        return False


def _remove_unstarted(created_run: Optional[str], process_dir: Optional[str]) -> None:
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


def _start_pysampler(hz: int) -> None:
    """Python stack samples (csrc/record/pysampler.cc); a failure turns only them off, with one line."""
    try:
        err = _native.pysampler_start(hz)
    except Exception as exc:  # noqa: BLE001
        err = f"{type(exc).__name__}: {exc}"
    if err:
        safety.warn_once("pysampler", f"stepscope: Python stack samples are off ({err}); "
                         "the rest of the profile is recorded")
        add_note(f"Python stack samples: off ({err})")


def start(**kwargs) -> Optional[Session]:
    """Starts profiling this process (SPEC §1). Returns the session.

    Bad keyword values raise ValueError. Bad ``STEPSCOPE_*`` variables and any
    failure to set up the run (an unwritable folder, say) print one warning and
    return None: the program runs on unprofiled.
    """
    global _session
    explicit = {k: v for k, v in kwargs.items() if v is not None}
    resolve(env={}, **explicit)  # keyword errors are the caller's to fix: raise them
    with _lock:
        if _session is not None and _session.active:
            return _session
        try:
            config = resolve(**explicit)
            _session = _open(config, _run_folder(config), "main", None)
            annotations.by_hand = False  # a new session: who marks steps is learnt again
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("could not start profiling", exc)
            return None
        # Children (spawned workers, subprocesses) that import stepscope join this run.
        _export_active_run(_session)
        rank = runinfo.rank_from_env()
        os.environ[_PARENT_RANK_VAR] = "" if rank is None else str(rank)
        os.environ["STEPSCOPE_RUN"] = _session.name
        return _session


def _run_folder(config: Config) -> str:
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


def stop() -> None:
    """Stops the current session, if any."""
    s = _session
    if s is not None:
        s.stop()


def current() -> Optional[Session]:
    """The active session of this process, or None."""
    s = _session
    return s if s is not None and s.active else None


class profile:
    """``with stepscope.profile(...) as run:`` -- start() on entry, stop() on exit."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        self._session: Optional[Session] = None
        resolve(env={}, **{k: v for k, v in kwargs.items() if v is not None})

    def __enter__(self) -> Optional[Session]:
        self._session = start(**self._kwargs)
        return self._session

    def __exit__(self, *exc) -> None:
        if self._session is not None:
            self._session.stop()


def disable_after_failure() -> None:
    """Called by safety.report_failure: stop recording, keep the program going."""
    s = _session
    if s is not None and s.active:
        try:
            s.stop()
        except Exception:  # noqa: BLE001 - called on a failure already reported: the program goes on
            pass


# --- children ---------------------------------------------------------------------
def _join(run_dir: str, origin: str, parent: Optional[str]) -> None:
    """Joins an existing run from a child process; never raises."""
    global _session
    try:
        config = resolve()
        _session = _open(config, run_dir, origin, parent)
        _export_active_run(_session)
        _register_exit_hooks()
    except Exception as exc:  # noqa: BLE001
        safety.report_failure(f"could not profile child process {os.getpid()}", exc)


def _after_fork_in_child() -> None:
    global _session
    parent = _session
    safety.reset()
    if parent is not None and parent._node_lock is not None:
        # The child's copy of the election file: closing it keeps the parent's
        # flock (it goes with the last descriptor) and leaves nothing unclosed.
        parent._node_lock.close()
        parent._node_lock = None
    if parent is None or not parent.active:
        _session = None
        return
    parent.active = False  # the parent's session belongs to the parent
    _session = None
    _join(parent.run_dir, "fork", os.path.basename(parent.process_dir))


def _register_exit_hooks() -> None:
    # multiprocessing's children leave through os._exit(): atexit does not run
    # there, multiprocessing's finalizers do. Its Process._bootstrap clears the
    # finalizers registered so far, then runs the after-fork hooks: register
    # the finalizer now and again from such a hook.
    if "multiprocessing" not in sys.modules or _session is None:
        return
    try:
        from multiprocessing import util

        def finalize_stop(_session_obj=None):
            util.Finalize(None, stop, exitpriority=-1000)

        finalize_stop()
        util.register_after_fork(_session, finalize_stop)
    except Exception:  # noqa: BLE001 - without these hooks a child's end goes unrecorded, nothing worse
        pass


def _export_active_run(session: Session) -> None:
    """What a child needs to join this run, and to tell that it is still being recorded."""
    os.environ[_ACTIVE_RUN_VAR] = session.run_dir
    os.environ[_OWNER_VAR] = runinfo.process_token()
    os.environ[_PARENT_PROCESS_VAR] = os.path.basename(session.process_dir)


def _parent_run_problem(run_dir: str) -> Optional[str]:
    """Why STEPSCOPE_ACTIVE_RUN is not a run that an ancestor of this process records
    now (a value left in a shell, a stopped session), or None. The owner token must
    name a live ancestor, and the process folder it exported must be that process's,
    with no end time yet (docs/design.md, "Runs, processes and children")."""
    token = os.environ.get(_OWNER_VAR, "")
    folder = os.environ.get(_PARENT_PROCESS_VAR, "")
    if not os.path.isabs(run_dir) or not os.path.isdir(run_dir):
        return "no such run folder"
    if not token:
        return "no process that records it is named"
    problem = runinfo.token_problem(token)
    if problem:
        return problem
    if run_name_problem(folder):
        return "no process folder is named"
    meta = runinfo.read_json(os.path.join(run_dir, folder, PROCESS_JSON))
    if str(meta.get("pid")) != token.partition(":")[0]:
        return f"{folder} is not the folder of process {token.partition(':')[0]}"
    if meta.get("end_time") is not None:
        return "that process stopped recording it"
    return None


def _forget_parent_run(run_dir: str, problem: str) -> None:
    """A stale STEPSCOPE_ACTIVE_RUN: not joined, not passed on; one line only under STEPSCOPE=1."""
    for var in (_ACTIVE_RUN_VAR, _OWNER_VAR, _PARENT_PROCESS_VAR, _PARENT_RANK_VAR):
        os.environ.pop(var, None)
    if os.environ.get("STEPSCOPE", "").strip().lower() not in ("", "0", "false", "no", "off"):
        safety.warn_once("stale-run", f"stepscope: ignoring {_ACTIVE_RUN_VAR}={shown(run_dir)} ({problem}); "
                         "this process records a run of its own")


def join_parent_run_if_any() -> None:
    """On import in a spawned child: join the run the parent process is writing."""
    run_dir = os.environ.get(_ACTIVE_RUN_VAR)
    if run_dir and _session is None:
        problem = _parent_run_problem(run_dir)
        if problem:
            _forget_parent_run(run_dir, problem)
            return
        # A child with a rank of its own (a launcher's worker) is a rank, not a helper.
        rank = runinfo.rank_from_env()
        own_rank = rank is not None and str(rank) != os.environ.get(_PARENT_RANK_VAR, "")
        _join(run_dir, "main" if own_rank else "spawn", None if own_rank else os.environ.get(_PARENT_PROCESS_VAR))


atexit.register(stop)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
