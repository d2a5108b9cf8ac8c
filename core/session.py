"""The profiling session: one per process, writing one trace into a run folder.

Its parts: this module starts and stops the session (and its samplers), and
makes a forked child's session; core/run_folder.py lays out the run's folders
and writes their metadata; core/parent_run.py tells a spawned child which run
to join. Forked and spawned children (DataLoader workers) join with process
folders of their own.
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

from stepscope.core import _native, annotations, files, gpu, parent_run, run_folder, runinfo, safety
from stepscope.core.config import Config, native_settings, resolve
from stepscope.core.sampling import start_sampling
from stepscope.core.vocabulary import PROCESS_JSON, RUN_JSON, TRACE_FILE

__all__ = ["Session", "start", "stop", "current", "profile"]

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
                parent_run.unexport(self.run_dir)
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
            if not os.path.isdir(self.process_dir):  # (a run inside a temporary directory the program removed)
                safety.warn_once("run removed", f"stepscope: the run's folder {self.process_dir} was removed while "
                                                "the program ran; nothing to finish")
                return
            if (not self.stats.get("written") and not self.stats.get("dropped")
                    and run_folder.has_siblings(self.run_dir, self.process_dir)):
                # A process that recorded nothing (most DataLoader workers, a torchrun
                # agent) leaves no folder beside the ones that did.
                shutil.rmtree(self.process_dir, ignore_errors=True)
                if self.created_run:
                    run_folder.finish_run_json(self.run_dir, self._start_wall, time.time(),
                                               runinfo.framework_versions())
                return
            meta = run_folder.finish_process_json(self.run_dir, self.process_dir, self.origin, self.stats)
            if self.created_run:
                run_folder.finish_run_json(self.run_dir, self._start_wall, meta["end_time"], meta["versions"])
        except Exception as exc:  # noqa: BLE001
            safety.report_failure(f"finishing the run in {self.process_dir} failed", exc)

    def load(self):
        """The recorded run as tables (see stepscope.load)."""
        if _loader is None:  # (stepscope/__init__.py sets it: core itself knows no analysis)
            raise RuntimeError("no run loader: call stepscope.load(path)")
        return _loader(self.run_dir)


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
            run_folder.write_run_json(run_dir, config)
        process_dir = run_folder.make_process_dir(run_dir, origin)
        session = Session(config, run_dir, process_dir, created, origin, parent)
        meta = run_folder.process_json(origin, parent, session._start_wall)
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
        run_folder.remove_unstarted(run_dir if created else None, process_dir)  # a failed start leaves nothing
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
            _session = _open(config, run_folder.run_folder(config), "main", None)
            annotations.by_hand = False  # a new session: who marks steps is learnt again
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("could not start profiling", exc)
            return None
        # Children (spawned workers, subprocesses) that import stepscope join this run.
        parent_run.export(_session.run_dir, _session.process_dir)
        parent_run.export_rank()
        os.environ["STEPSCOPE_RUN"] = _session.name
        return _session


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


safety.on_failure(disable_after_failure)


# --- children ---------------------------------------------------------------------
def _join(run_dir: str, origin: str, parent: Optional[str]) -> None:
    """Joins an existing run from a child process; never raises."""
    global _session
    try:
        config = resolve()
        _session = _open(config, run_dir, origin, parent)
        parent_run.export(_session.run_dir, _session.process_dir)
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


def join_parent_run_if_any() -> None:
    """On import in a spawned child: join the run the parent process is writing."""
    if _session is None:
        found = parent_run.to_join()
        if found is not None:
            _join(*found)


atexit.register(stop)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
