"""Who is this process, and what is the run called: names and metadata.

Nothing here imports a framework: versions come from package metadata of
modules already imported.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import sys
import time
from typing import Optional

from stepscope.core import files, frameworks
from stepscope.core.config import run_name_problem, shown
from stepscope.core.safety import warn_once

# the libraries besides the frameworks (core/frameworks.py) whose versions run.json records:
# import name -> distribution name
LIBRARIES = {"numpy": "numpy", "pandas": "pandas", "pynvml": "nvidia-ml-py", "cupti": "cupti-python"}
_DISTRIBUTIONS = {**{f.module: f.distribution for f in frameworks.FRAMEWORKS}, **LIBRARIES}


def hostname() -> str:
    host = socket.gethostname().split(".")[0] or "host"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in host)


def rank_from_env(env=os.environ) -> Optional[int]:
    """The global rank set by torchrun, MPI or SLURM launchers, if any."""
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = env.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


# Integrations that know the rank better than the environment (a process group
# initialised in-process, as Lightning does) register a callable here.
_rank_providers: list = []


def register_rank_provider(provider) -> None:
    """provider() -> (rank, world_size) or None."""
    if provider not in _rank_providers:
        _rank_providers.append(provider)


_noted_rank: Optional[tuple] = None


def note_rank(rank: int, world_size: Optional[int]) -> None:
    """An integration saw this process join a process group as ``rank`` (it may be
    destroyed before the process ends, when the providers no longer know it)."""
    global _noted_rank
    _noted_rank = (rank, world_size)


def rank_from_providers() -> Optional[tuple]:
    """(rank, world_size) of a process group initialised in this process, if any."""
    for provider in _rank_providers:
        try:
            found = provider()
        except Exception:  # noqa: BLE001
            found = None
        if found is not None:
            return found
    return _noted_rank


def current_rank() -> tuple:
    """(rank, world_size): from the launcher's variables, else from a registered provider."""
    rank, world = rank_from_env(), world_size_from_env()
    if rank is None:
        found = rank_from_providers()
        if found is not None:
            return found
    return rank, world


def world_size_from_env(env=os.environ) -> Optional[int]:
    for var in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        value = env.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


SCRIPT_CHARS = 120


def script_name(argv=None) -> str:
    argv = sys.argv if argv is None else argv
    first = argv[0] if argv and argv[0] else ""
    base = os.path.basename(first)
    if base in ("", "-c", "-m") or base.startswith("<"):
        return "python"
    stem = base[:-3] if base.endswith(".py") else base
    if stem == "__main__":  # python -m pkg
        stem = os.path.basename(os.path.dirname(first)) or "python"
    stem = stem[:SCRIPT_CHARS]  # the run name stays one folder name (NAME_MAX)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "python"


def process_start_time(pid: Optional[int] = None) -> Optional[float]:
    """When a process started (epoch seconds), from /proc; None where unknown."""
    return _start_time(os.getpid() if pid is None else pid)


def _parent_start_time(ppid: int) -> Optional[float]:
    """The parent's start time (epoch seconds): ranks started by one launcher share it."""
    return _start_time(ppid)


def _start_time(pid: int) -> Optional[float]:
    start_ticks = _start_ticks(pid)
    if start_ticks is None:
        return None
    try:
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _stat_field(pid: int, index: int) -> Optional[int]:
    """A numeric field of /proc/<pid>/stat, counted after the command name; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[index])
    except (OSError, ValueError, IndexError):
        return None


def _start_ticks(pid: int) -> Optional[int]:
    """When a process started, in clock ticks since boot: with its pid, it names one process."""
    return _stat_field(pid, 19)


def _parent_of(pid: int) -> Optional[int]:
    return os.getppid() if pid == os.getpid() else _stat_field(pid, 1)


def process_token(pid: Optional[int] = None) -> str:
    """``<pid>:<start ticks>``: this process, and never a later one that reuses its pid
    (the ticks are empty where /proc is not there)."""
    pid = os.getpid() if pid is None else pid
    ticks = _start_ticks(pid)
    return f"{pid}:{'' if ticks is None else ticks}"


def token_problem(token: str) -> Optional[str]:
    """Why the process a ``process_token`` names is not a running ancestor of this
    process, or None when it is."""
    pid_text, _, ticks = token.partition(":")
    if not pid_text.isdigit() or not (ticks == "" or ticks.isdigit()):
        return "it names no process"
    pid = int(pid_text)
    if ticks and str(_start_ticks(pid)) != ticks:
        return f"its process {pid} is not running"
    if not ticks and not _alive(pid):
        return f"its process {pid} is not running"
    ancestor = os.getppid()
    for _ in range(4096):  # the chain of parents up to init (pid 1) or a subreaper
        if ancestor == pid:
            return None
        if ancestor is None or ancestor <= 1:
            break
        ancestor = _parent_of(ancestor)
    return f"its process {pid} is not an ancestor of this one"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except PermissionError:
        return True
    except OSError:
        return False


def derive_run_name(env=os.environ, argv=None, now: Optional[float] = None) -> str:
    """``<script>-<YYYYmmdd-HHMMSS>``; ranks of one launch agree on it. A name made
    from a launcher's id that cannot be a run folder ('..', '/', too long) is
    replaced by the generated one, with one warning line."""
    script = script_name(argv)
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        name = f"{script}-{run_id}"
        problem = run_name_problem(name)
        if problem is None:
            return name
        warn_once("run-name", f"stepscope: TORCHELASTIC_RUN_ID={shown(run_id)} cannot name a run folder "
                  f"({problem}); the run gets a generated name")
    stamp = now if now is not None else time.time()
    if rank_from_env(env) is not None:
        parent = _parent_start_time(os.getppid())
        if parent is not None:
            stamp = parent
    return f"{script}-{_dt.datetime.fromtimestamp(stamp).strftime('%Y%m%d-%H%M%S')}"


def framework_versions() -> dict:
    """Versions of the frameworks this process has imported (never imports one)."""
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for module, distribution in _DISTRIBUTIONS.items():
        if module in sys.modules:
            try:
                versions[module] = metadata.version(distribution)
            except Exception:  # noqa: BLE001 - any broken distribution metadata: the module's own version
                versions[module] = getattr(sys.modules[module], "__version__", "unknown")
    return versions


def read_json(path: str) -> dict:
    """A JSON object from a file, or {} if it is missing or damaged."""
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with files.open_new(tmp) as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


def update_json_locked(path: str, update) -> None:
    """Read-modify-write of a JSON file shared by the processes of a run. The
    lock is a flock on the file's folder: no lock file is left in the run."""
    import fcntl

    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = read_json(path)
        update(data)
        write_json_atomic(path, data)
    finally:
        os.close(fd)  # releases the flock


def record_process(run_json: str, host: str, rank: Optional[int], world_size: Optional[int]) -> None:
    """A main process adds itself to run.json: its host, its rank, and the world size
    (the process that created the run may have had none: a torchrun agent)."""
    def update(info):
        if world_size is not None and not info.get("world_size"):
            info["world_size"] = world_size
        if host not in info.setdefault("hosts", []):
            info["hosts"].append(host)
        if rank is not None and rank not in info.setdefault("ranks", []):
            info["ranks"] = sorted(info["ranks"] + [rank])

    update_json_locked(run_json, update)


def clock_anchor() -> dict:
    """A (wall clock, monotonic clock) pair to align processes and hosts later."""
    best = None
    for _ in range(5):
        m0 = time.monotonic_ns()
        wall = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, wall, (m0 + m1) // 2)
    width, wall, mono = best
    return {"realtime_ns": wall, "monotonic_ns": mono, "uncertainty_ns": width}
