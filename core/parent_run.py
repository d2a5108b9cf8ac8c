"""Children join their parent's run (docs/design.md, "Runs, processes and children").

A recording process exports its run through the environment; a child that
imports stepscope (a spawned worker, a subprocess, a launcher's rank) joins it,
but only while the process that exported it still records it: a value left in
a shell, or by a stopped session, is forgotten. Forked children join through
core/session.py's fork hook, with no environment to read.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

from stepscope.core import runinfo, safety
from stepscope.core.config import run_name_problem, shown
from stepscope.core.vocabulary import PROCESS_JSON

ACTIVE_RUN_VAR = "STEPSCOPE_ACTIVE_RUN"
PARENT_RANK_VAR = "STEPSCOPE_PARENT_RANK"
PARENT_PROCESS_VAR = "STEPSCOPE_PARENT_PROCESS"  # the process folder of the parent: a spawned helper's owner
OWNER_VAR = "STEPSCOPE_ACTIVE_OWNER"  # runinfo.process_token() of the process recording the active run


def export(run_dir: str, process_dir: str) -> None:
    """What a child needs to join this run, and to tell that it is still being recorded."""
    os.environ[ACTIVE_RUN_VAR] = run_dir
    os.environ[OWNER_VAR] = runinfo.process_token()
    os.environ[PARENT_PROCESS_VAR] = os.path.basename(process_dir)


def export_rank() -> None:
    """This process's rank, for a child to tell whether it is a rank of its own."""
    rank = runinfo.rank_from_env()
    os.environ[PARENT_RANK_VAR] = "" if rank is None else str(rank)


def unexport(run_dir: str) -> None:
    """The run stopped: children started from now on do not join it."""
    if os.environ.get(ACTIVE_RUN_VAR) == run_dir:
        del os.environ[ACTIVE_RUN_VAR]
        os.environ.pop(OWNER_VAR, None)


def to_join() -> Optional[Tuple[str, str, Optional[str]]]:
    """(run folder, origin, parent's process folder) of the run this process should join, or None."""
    run_dir = os.environ.get(ACTIVE_RUN_VAR)
    if not run_dir:
        return None
    problem = _problem(run_dir)
    if problem:
        _forget(run_dir, problem)
        return None
    # A child with a rank of its own (a launcher's worker) is a rank, not a helper.
    rank = runinfo.rank_from_env()
    own_rank = rank is not None and str(rank) != os.environ.get(PARENT_RANK_VAR, "")
    return run_dir, "main" if own_rank else "spawn", None if own_rank else os.environ.get(PARENT_PROCESS_VAR)


def _problem(run_dir: str) -> Optional[str]:
    """Why STEPSCOPE_ACTIVE_RUN is not a run that an ancestor of this process records
    now (a value left in a shell, a stopped session), or None. The owner token must
    name a live ancestor, and the process folder it exported must be that process's,
    with no end time yet."""
    token = os.environ.get(OWNER_VAR, "")
    folder = os.environ.get(PARENT_PROCESS_VAR, "")
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


def _forget(run_dir: str, problem: str) -> None:
    """A stale STEPSCOPE_ACTIVE_RUN: not joined, not passed on; one line only under STEPSCOPE=1."""
    for var in (ACTIVE_RUN_VAR, OWNER_VAR, PARENT_PROCESS_VAR, PARENT_RANK_VAR):
        os.environ.pop(var, None)
    if os.environ.get("STEPSCOPE", "").strip().lower() not in ("", "0", "false", "no", "off"):
        safety.warn_once("stale-run", f"stepscope: ignoring {ACTIVE_RUN_VAR}={shown(run_dir)} ({problem}); "
                         "this process records a run of its own")
