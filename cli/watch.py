"""``stepscope watch RUN``: the rules on a run still being written (what the native
writer has flushed, at most a second old), new findings printed as they appear and
handed to ``--exec CMD`` as JSON on stdin (SageMaker Debugger's rule actions: stop the
job, notify someone). Ends when the run ends (run.json gets ``end_time`` when the
process that started it stops; or every process of it on this host has exited), on
Ctrl-C, or after ``--timeout``."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

from stepscope.cli.args import UsageError, rule_params
from stepscope.core import runinfo
from stepscope.core.vocabulary import PROCESS_JSON, RUN_JSON

DEFAULT_EVERY_S = 60.0
APPEAR_S = 60.0  # how long a run that does not exist yet is waited for
_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_seconds(text: str, what: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|min|m|h)?\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{what} {text!r}: expected a duration such as 60, 60s, 500ms or 2m")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def add_parser(sub, usage_error):
    w = sub.add_parser("watch", help="the rules on a run still being written; new findings as they appear")
    w.add_argument("run")
    w.add_argument("--every", help="time between evaluations: 60, 60s, 500ms, 2m (default 60 s, or the "
                                   "smallest Debugger scan_interval_us given with --param)")
    w.add_argument("--exec", "--on-finding", dest="exec_cmd", metavar="CMD",
                   help="shell command run once per new finding, the finding as JSON on its stdin")
    w.add_argument("--timeout", help="stop watching after this long (same form as --every)")
    w.add_argument("--json", action="store_true", help="print each new finding as one JSON line")
    w.set_defaults(func=watch_command)
    return w


def _key(f: dict) -> tuple:
    """A finding's identity across evaluations: its figures change as the run grows."""
    e = f.get("evidence") or {}
    return (f["rule"], f.get("rank"), *(str(e.get(k)) for k in ("process", "node", "gpu", "mode", "test")))


def run_ended(path: str) -> str:
    """Why the run is over ('' while it goes on)."""
    info = runinfo.read_json(os.path.join(path, RUN_JSON))
    if info.get("end_time"):
        return "the run ended"
    here = socket.gethostname()
    pids, foreign = [], False
    for d in os.listdir(path):
        meta = runinfo.read_json(os.path.join(path, d, PROCESS_JSON))
        if not meta:
            continue
        if meta.get("end_time"):
            continue
        if meta.get("host") not in (here, runinfo.hostname()):
            foreign = True
        elif isinstance(meta.get("pid"), int):
            pids.append(meta["pid"])
    if pids and not foreign and not any(_alive(p) for p in pids):
        return "every process of the run exited without closing it"
    return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _evaluate(path, params):
    from stepscope.analysis import load
    from stepscope.analysis.rules import evaluate

    return evaluate(load(path, quiet=True), params)["findings"]


def _handle(f: dict, args, path: str) -> None:
    if args.json:
        print(json.dumps(f), flush=True)
    else:
        level = "" if f.get("severity", "warning") == "warning" else f" ({f['severity']})"
        print(f"[{f['rule']}]{level} {f['message']}\n    -> {f['recommendation']}", flush=True)
    if args.exec_cmd:
        env = dict(os.environ, STEPSCOPE_WATCH_RUN=path, STEPSCOPE_FINDING_RULE=f["rule"])
        r = subprocess.run(args.exec_cmd, shell=True, input=json.dumps(f), text=True, env=env)
        if r.returncode:
            print(f"stepscope: --exec exited {r.returncode} for {f['rule']}", file=sys.stderr, flush=True)


def watch_command(args) -> int:
    from stepscope.analysis.store.reader import RunFormatError, resolve_run_path

    try:
        timeout = parse_seconds(args.timeout, "--timeout") if args.timeout else None
        every = parse_seconds(args.every, "--every") if args.every else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    params = rule_params(args)
    if every is None:
        scans = [p["scan_interval_us"] / 1e6 for p in params.values() if p.get("scan_interval_us")]
        every = min(scans) if scans else DEFAULT_EVERY_S
    start = time.monotonic()
    deadline = start + timeout if timeout else None
    path = None
    while path is None:  # the job may not have created its run yet
        try:
            path = resolve_run_path(args.run)
        except RunFormatError as exc:
            waited = time.monotonic() - start
            if waited > APPEAR_S or (deadline and time.monotonic() > deadline):
                raise UsageError(str(exc)) from None
            time.sleep(0.5)
    print(f"stepscope: watching {path} every {every:g} s", file=sys.stderr, flush=True)
    seen = set()
    try:
        while True:
            ended = run_ended(path)  # before reading: the last pass then sees everything
            try:
                findings = _evaluate(path, params)
            except Exception as exc:  # noqa: BLE001 - a run mid-write: try again at the next tick
                findings = []
                print(f"stepscope: could not evaluate yet ({type(exc).__name__}: {exc})", file=sys.stderr,
                      flush=True)
            for f in findings:
                if _key(f) not in seen:
                    seen.add(_key(f))
                    _handle(f, args, path)
            if ended:
                print(f"stepscope: {ended}; {len(seen)} finding(s)", file=sys.stderr, flush=True)
                return 0
            next_at = time.monotonic() + every
            while time.monotonic() < next_at and not run_ended(path):
                if deadline and time.monotonic() > deadline:
                    print(f"stepscope: stopped watching after --timeout {args.timeout}; {len(seen)} finding(s)",
                          file=sys.stderr, flush=True)
                    return 0
                time.sleep(min(0.5, every))
    except KeyboardInterrupt:
        print(f"stepscope: stopped watching; {len(seen)} finding(s)", file=sys.stderr, flush=True)
        return 130
