"""``stepscope merge DIR... -o RUN``, and the several-folder form of ``summary`` and
``report``: those merge on the fly into a temporary run (traces symlinked, so
nothing is copied) that is removed afterwards; ``merge`` keeps the result."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile


def add_parser(sub, usage_error):
    m = sub.add_parser("merge", help="one run from the per-node run folders of a multi-node job")
    m.add_argument("dirs", nargs="+", metavar="DIR")
    m.add_argument("-o", "--output", required=True, metavar="RUN", help="the merged run folder (new or empty)")

    def command(args) -> int:
        from stepscope.analysis.store.merge import MergeError, merge

        try:
            result = merge(args.dirs, args.output)
        except MergeError as exc:
            raise usage_error(str(exc)) from None
        _print_warnings(result["warnings"])
        print(os.path.abspath(result["path"]))
        return 0

    m.set_defaults(func=command)
    return m


def _print_warnings(warnings) -> None:
    for w in warnings:
        print(f"stepscope: warning: {w}", file=sys.stderr)


@contextlib.contextmanager
def run_path(runs, usage_error):
    """The one run folder named, or several merged into a temporary one (yielded as a path)."""
    if len(runs) == 1:
        yield runs[0]
        return
    from stepscope.analysis.store.merge import MergeError, merge, merged_name

    tmp = tempfile.mkdtemp(prefix="stepscope-merge-")
    try:
        try:
            name = merged_name(runs) or "merged"
            result = merge(runs, os.path.join(tmp, name), symlink=True)
        except MergeError as exc:
            raise usage_error(str(exc)) from None
        _print_warnings(result["warnings"])
        yield result["path"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
