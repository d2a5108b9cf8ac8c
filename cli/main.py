"""``stepscope`` commands. Exit 0 on success, 2 on bad input with a one-line reason."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import List, Optional

from stepscope.cli.args import UsageError, rule_params
from stepscope.core import config as _config
from stepscope.core import metadata, runinfo
from stepscope.core.vocabulary import DEFAULT_DIR, GPU_MODES, RUN_JSON


def _run_command(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("stepscope run needs a command after --, e.g. stepscope run -- python train.py")
    env = dict(os.environ)
    overrides = {"dir": args.dir, "name": args.name, "interval_ms": args.interval_ms, "gpu": args.gpu}
    try:
        cfg = _config.resolve(env=env, **{k: v for k, v in overrides.items() if v is not None})
    except _config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    script = next((c for c in cmd if c.endswith(".py")), os.path.basename(cmd[0]))
    name = cfg.name or runinfo.derive_run_name(env={}, argv=[script])
    run_dir = os.path.abspath(os.path.join(cfg.dir, name))
    env.update({"STEPSCOPE": "1", "STEPSCOPE_DIR": os.path.abspath(cfg.dir), "STEPSCOPE_RUN": name,
                "STEPSCOPE_INTERVAL_MS": str(cfg.interval_ms), "STEPSCOPE_GPU": cfg.gpu})
    for var in ("STEPSCOPE_ACTIVE_RUN", "STEPSCOPE_ACTIVE_OWNER", "STEPSCOPE_PARENT_PROCESS"):
        env.pop(var, None)  # CMD's processes record this run, not one this shell's process may have exported
    # Every Python process of CMD starts stepscope, even where .pth files are not read.
    bootstrap = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "core", "_bootstrap")
    env["PYTHONPATH"] = os.pathsep.join([bootstrap] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    print(f"stepscope: profiling into {run_dir}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        raise UsageError(f"cannot run {cmd[0]!r}: {exc.strerror or exc}") from None
    # The child gets the terminal's signals itself; forward what a scheduler sends us.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            continue
    if os.path.isdir(run_dir):
        try:
            from stepscope.analysis import load
            from stepscope.analysis.report.page import write_report
            from stepscope.analysis.report.summary import format_text, summarize

            run = load(run_dir, quiet=True)
            print(format_text(summarize(run)), file=sys.stderr)
            report = write_report(run)
            print(f"stepscope: report at {report}", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - the job's exit code matters more
            print(f"stepscope: could not summarize {run_dir}: {exc}", file=sys.stderr)
        print(f"stepscope: run written to {run_dir}", file=sys.stderr)
    return code if code >= 0 else 128 - code


def _fail_level(args):
    from stepscope.analysis.rules.base import fail_level

    if not getattr(args, "fail_on", None):
        return None
    try:
        return fail_level(args.fail_on)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@contextlib.contextmanager
def _run_errors():
    """A path that is not a readable run is bad input: exit 2 with its reason."""
    from stepscope.analysis import RunFormatError

    try:
        yield
    except RunFormatError as exc:
        raise UsageError(str(exc)) from None


def _summary_command(args) -> int:
    from stepscope.analysis.rules.base import at_or_above
    from stepscope.analysis.report.summary import format_text, summarize

    level = _fail_level(args)
    params = rule_params(args)
    from stepscope.cli.merge import run_path

    with _run_errors(), run_path(args.run, UsageError) as path:
        s = summarize(path, params)
    print(json.dumps(s, indent=2) if args.json else format_text(s))
    # a finding folded under the one that explains it still fired: the gate sees it
    failing = at_or_above(s["findings"] + s.get("related_findings", []), level) if level else []
    if failing:  # a CI gate: stdout stays the summary, the verdict goes to stderr
        names = ", ".join(sorted({f["rule"] for f in failing}))
        print(f"stepscope: {len(failing)} finding(s) at or above {level}: {names}", file=sys.stderr)
        return 1
    return 0


def _diff_command(args) -> int:
    from stepscope.analysis.report.diff import diff, format_diff, gate

    level = _fail_level(args)
    if args.max_regression is not None and args.max_regression < 0:
        raise UsageError(f"--max-regression {args.max_regression:g}: expected a percentage >= 0")
    params = rule_params(args)
    with _run_errors():
        d = diff(args.run_a, args.run_b, params, max_regression=args.max_regression)
    print(json.dumps(d, indent=2) if args.json else format_diff(d))
    failing = gate(d, level) if level else []
    if failing:
        print(f"stepscope: {'; '.join(failing)}", file=sys.stderr)
        return 1
    return 0


def _report_command(args) -> int:
    from stepscope.analysis import load
    from stepscope.analysis.report.page import write_report
    from stepscope.analysis.report.timeline_detail import parse_steps

    params = rule_params(args)
    try:
        steps = parse_steps(args.steps) if args.steps else None
    except ValueError:
        raise UsageError(f"--steps {args.steps!r}: expected A-B or A-B,C (train step numbers)") from None
    from stepscope.cli.merge import run_path

    with _run_errors(), run_path(args.run, UsageError) as path:
        run = load(path, quiet=True)
        # Several folders are merged into a temporary run: the report goes beside the caller.
        output = args.output or (None if len(args.run) == 1 else os.path.abspath(f"{run.name}-report.html"))
        print(write_report(run, output, params, steps))
    return 0


def _export_command(args) -> int:
    from stepscope.analysis import load
    from stepscope.analysis.export.formats import export
    from stepscope.analysis.report.timeline_detail import parse_steps

    with _run_errors():
        run = load(args.run, quiet=True)
    interactive = sys.stderr.isatty()

    def progress(done, total):
        if interactive and total:
            print(f"\rstepscope: exporting {100 * done // total}%", end="", file=sys.stderr, flush=True)

    try:
        steps = parse_steps(args.steps) if args.steps else None
        path = export(run, args.format, args.output, progress, by_phase=args.by_phase, steps=steps)
    except ValueError as exc:
        if args.steps and "step" in str(exc):
            raise UsageError(f"--steps: {exc}") from None
        raise
    if interactive:
        print("\r", end="", file=sys.stderr)
    print(path)
    return 0


def _ls_command(args) -> int:
    from stepscope.analysis.store.reader import process_folders

    root = args.dir or os.environ.get("STEPSCOPE_DIR") or DEFAULT_DIR
    if not os.path.isdir(root):
        raise UsageError(f"no folder {root!r}")
    rows = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not os.path.isfile(os.path.join(path, RUN_JSON)):
            continue
        info, _ = metadata.read(os.path.join(path, RUN_JSON), metadata.RUN_FIELDS)
        procs = process_folders(path)
        dur = info.get("duration_s")
        rows.append((name, f"{dur:.1f}s" if isinstance(dur, (int, float)) else "running?", len(procs),
                     " ".join(info.get("command", []))[:60]))
    if not rows:
        print(f"no runs in {root}")
        return 0
    width = max(len(r[0]) for r in rows)
    for name, dur, n, cmd in rows:
        print(f"{name:<{width}}  {dur:>9}  {n:>3} proc  {cmd}")
    return 0


def _rule_options(p) -> None:
    p.add_argument("--param", action="append", default=[], help="Rule.param=value (SageMaker Debugger's names too)")
    p.add_argument("--rules", action="append", default=[], metavar="MODULE:CLASS",
                   help="load custom rules (Rule subclasses); the stepscope.rules entry points load by themselves")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stepscope", description="Profile deep-learning training jobs.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a command profiled", formatter_class=argparse.RawDescriptionHelpFormatter,
                       usage="stepscope run [--dir D] [--name N] [--interval-ms MS] [--gpu MODE] -- CMD ARGS...")
    r.description = ("Runs CMD with stepscope on in every Python process it starts (python, torchrun,\n"
                     "accelerate launch, a shell script), then prints a short summary and where the run is.")
    r.epilog = "example:\n  stepscope run --name baseline -- torchrun --nproc_per_node 2 train.py --epochs 1"
    r.add_argument("--dir", metavar="D", help="root folder for runs (STEPSCOPE_DIR; default ./stepscope-runs)")
    r.add_argument("--name", metavar="N", help="the run's name (STEPSCOPE_RUN; default: script name and start time)")
    r.add_argument("--interval-ms", dest="interval_ms", metavar="MS",
                   help="system-metric sampling interval, 10 to 60000 (STEPSCOPE_INTERVAL_MS; default 100)")
    r.add_argument("--gpu", choices=GPU_MODES, metavar="MODE",
                   help="auto, off, metrics (NVML only) or trace (NVML and CUPTI activity) (STEPSCOPE_GPU)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    r.set_defaults(func=_run_command)

    s = sub.add_parser("summary", help="a run's numbers and findings")
    s.add_argument("run", nargs="+", help="a run folder or name; several: the per-node folders of one job, "
                                          "merged on the fly (see stepscope merge)")
    s.add_argument("--json", action="store_true", help="the summary as JSON (the schema in docs/)")
    _rule_options(s)
    s.add_argument("--fail-on", dest="fail_on", metavar="WARN|ERROR",
                   help="exit 1 when a finding has this severity or a higher one (a CI gate)")
    s.set_defaults(func=_summary_command)

    d = sub.add_parser("diff", help="what changed between two runs")
    d.add_argument("run_a", help="the run before the change (a folder or name)")
    d.add_argument("run_b", help="the run after it")
    d.add_argument("--json", action="store_true", help="the differences as JSON")
    _rule_options(d)
    d.add_argument("--fail-on", dest="fail_on", metavar="WARN|ERROR",
                   help="exit 1 on a step-time regression (severity error) or a finding new in RUN_B at or above "
                        "this severity")
    d.add_argument("--max-regression", dest="max_regression", type=float, default=None, metavar="PCT",
                   help="median step time of RUN_B more than PCT%% above RUN_A's is a regression (default 10)")
    d.set_defaults(func=_diff_command)

    rp = sub.add_parser("report", help="a self-contained HTML report")
    rp.add_argument("run", nargs="+", help="a run folder or name; several: per-node folders merged on the fly "
                                           "(the report then defaults to ./<run>-report.html)")
    rp.add_argument("-o", "--output", metavar="FILE", help="where to write it (default: report.html in the run)")
    _rule_options(rp)
    rp.add_argument("--steps", help="train steps to keep in full detail in the timeline, e.g. 100-120 "
                    "(besides the ones chosen for meaning; a larger page)")
    rp.set_defaults(func=_report_command)

    e = sub.add_parser("export", help="a trace for Perfetto / chrome://tracing, or Parquet tables")
    e.add_argument("run", help="a run folder or name")
    e.add_argument("--format", required=True, choices=("chrome", "perfetto", "parquet", "speedscope", "collapsed"))
    e.add_argument("-o", "--output", metavar="PATH", help="where to write (default: inside the run folder)")
    e.add_argument("--by-phase", action="store_true", help="collapsed: the phase as each stack's root frame")
    e.add_argument("--steps", help="chrome/perfetto: only what ran during these train steps, e.g. 100-120 "
                   "(a large run is then read a window at a time)")
    e.set_defaults(func=_export_command)

    from stepscope.cli.merge import add_parser as add_merge
    from stepscope.cli.watch import add_parser as add_watch

    add_merge(sub, UsageError)

    _rule_options(add_watch(sub, UsageError))

    ls = sub.add_parser("ls", help="the runs in a folder")
    ls.add_argument("dir", nargs="?", help="default: STEPSCOPE_DIR or ./stepscope-runs")
    ls.set_defaults(func=_ls_command)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
