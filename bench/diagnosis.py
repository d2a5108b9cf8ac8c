"""A rule's verdicts against the truth: findings expected vs fired, over the conformance
corpus (healthy jobs of many shapes: no finding expected) and the diagnosis jobs
(tests/scripts/rule_jobs.py: each provokes its rule, or none).

    python3 bench/diagnosis.py [--rule StepOutlier|all] [--before FILE] [-k SUBSTRING]
                               [--keep DIR [--judge-only]] [--repeat N]

Each job runs once under STEPSCOPE=1 (the corpus's torchrun cases under torchrun); the
rule is judged on that run as it is now and, with --before, as the module FILE defines
it (e.g. `git show REV:analysis/rules/outlier.py > /tmp/before.py`), so both verdicts
come from the same runs. ``--keep DIR`` keeps the runs in DIR; with ``--judge-only`` the
runs kept there are judged again without running a job (a rule changed, the same runs).
Prints one row per job and the precision and recall of each;
``--rule all``: every rule judged on the same runs, a line of figures per rule.
``--repeat N`` runs every job N times (issue 75: three): precision and recall count every
run, and the verdict stability is the share of jobs whose findings were the same in all N.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "tests", "conformance")
JOBS = os.path.join(REPO, "tests", "scripts", "rule_jobs.py")
# The diagnosis jobs and the rules each must provoke (every other rule: none)
DIAGNOSIS = {"clean": [], "stall": ["StepOutlier"], "stall40": ["StepOutlier"], "slowtenth": ["StepOutlier"],
             "onehiccup": [], "evalpasses": [], "epochworkers": ["StepOutlier"], "slowdata": ["GetNextBottleneck"],
             "leak": ["HostMemoryIncrease"], "slowinit": ["MaxInitializationTime"]}
# the parameters a diagnosis job is judged with (slowinit's 6 s set-up, against a 5 s threshold: as its test)
PARAMS = {"diagnosis:slowinit": {"MaxInitializationTime": {"threshold_s": 5.0}}}


def truth_of(path):
    lines = [ln[len("# expect:"):] for ln in open(path) if ln.startswith("# expect:")]
    return json.loads("".join(lines)) if lines else None


def jobs(substring):
    for name in sorted(os.listdir(CORPUS)):
        path = os.path.join(CORPUS, name)
        truth = truth_of(path) if name.endswith(".py") else None
        if truth is None or (substring and not any(k in name for k in substring.split(","))):
            continue
        expected = truth.get("findings", [])  # a healthy job: none; a case whose truth names a real problem: it
        cmd = [sys.executable, path, *truth.get("args", [])]
        if truth.get("launch") == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                   path, *truth.get("args", [])]
        # a corpus case that crashes on purpose is still a healthy loop until it does
        yield name[:-3], cmd, truth.get("timeout", 300), expected
    for kind, expected in DIAGNOSIS.items():
        if not substring or any(k in f"diagnosis:{kind}" for k in substring.split(",")):
            yield f"diagnosis:{kind}", [sys.executable, JOBS, kind], 300, expected


def rule_from(path, name):
    spec = importlib.util.spec_from_file_location("before_rule", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)()


def fired(rule, run, params=None):
    from stepscope.analysis.rules import evaluate
    from stepscope.analysis.rules.base import negligible

    if rule is None:
        result = evaluate(run, params)  # (a related finding is shown under the one that explains it)
        return sorted({f["rule"] for f in result["findings"]})
    if rule.not_applicable(run):
        return []
    return sorted({f.rule for f in rule.evaluate(run, rule.defaults()) if not negligible(run, f)})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rule", default="StepOutlier")
    p.add_argument("--before", help="a module file defining the rule as it was")
    p.add_argument("-k", dest="substring", help="only the jobs whose name contains this (a,b: either)")
    p.add_argument("--keep", metavar="DIR", help="keep the runs in DIR (judge them again with --judge-only)")
    p.add_argument("--judge-only", action="store_true", help="judge the runs kept in --keep DIR, running no job")
    p.add_argument("--repeat", type=int, default=1, help="run every job this many times (verdict stability)")
    args = p.parse_args()
    if args.judge_only and not args.keep:
        p.error("--judge-only needs --keep DIR")
    if args.repeat > 1 and args.judge_only:
        p.error("--repeat runs the jobs again: not with --judge-only")
    import stepscope

    before = rule_from(args.before, args.rule) if args.before else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = os.path.abspath(args.keep) if args.keep else os.path.join(tmp, "runs")
        for name, cmd, timeout, expected in [(f"{n}#{i}" if args.repeat > 1 else n, c, t, e)
                                             for n, c, t, e in jobs(args.substring) for i in range(args.repeat)]:
            folder = os.path.join(runs, name.replace(":", "-").replace("#", "-"))
            try:
                if not args.judge_only:
                    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
                    env.update(STEPSCOPE="1", STEPSCOPE_DIR=runs, STEPSCOPE_RUN=os.path.basename(folder))
                    cwd = os.path.join(tmp, os.path.basename(folder))
                    os.makedirs(cwd)
                    subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, timeout=timeout)
                run = stepscope.load(folder, quiet=True)
            except Exception as exc:  # noqa: BLE001 - a job that could not run is reported, not judged
                print(f"{name}: not judged ({type(exc).__name__}: {exc})", flush=True)
                continue
            every = fired(None, run, PARAMS.get(name.split("#")[0]))
            if args.rule == "all":
                rows.append((name, expected, None, every))
                print(f"{name:48} expected {expected or '-'}  fired {every or '-'}", flush=True)
                continue
            now = [r for r in every if r == args.rule]
            then = fired(before, run) if before else None
            want = [r for r in expected if r == args.rule]
            rows.append((name, want, then, now))
            print(f"{name:48} expected {want or '-'}  before {then if then is not None else '?'}  now {now or '-'}",
                  flush=True)
    if args.repeat > 1:
        _stability(rows)
    if args.rule == "all":
        return _every_rule(rows)
    for label, column in (("before", 2), ("now", 3)):
        if column == 2 and before is None:
            continue
        tp = sum(1 for r in rows if r[1] and r[column])
        fp = sum(1 for r in rows if not r[1] and r[column])
        fn = sum(1 for r in rows if r[1] and not r[column])
        precision = tp / (tp + fp) if tp + fp else 1.0
        recall = tp / (tp + fn) if tp + fn else 1.0
        print(f"{args.rule} {label}: {len(rows)} jobs, fired on {tp + fp} ({tp} expected, {fp} not), missed {fn}; "
              f"precision {precision:.2f}, recall {recall:.2f}")


def _stability(rows) -> None:
    """The share of jobs whose findings were the same in every one of their runs."""
    verdicts = {}
    for name, _, _, now in rows:
        verdicts.setdefault(name.split("#")[0], []).append(tuple(now))
    same = [job for job, v in verdicts.items() if len(set(v)) == 1]
    flips = [f"{job} ({' / '.join(','.join(x) or '-' for x in v)})" for job, v in verdicts.items() if len(set(v)) > 1]
    print(f"verdict stability: {len(same)} of {len(verdicts)} jobs gave the same findings in every run"
          + (f"; changed: {'; '.join(flips)}" if flips else ""))


def _every_rule(rows) -> None:
    """Per rule that was expected or fired: the jobs it fired on, expected or not, and missed."""
    rules = sorted({r for row in rows for r in row[1] + row[3]})
    tp_all = fp_all = fn_all = 0
    for rule in rules:
        tp = sum(1 for r in rows if rule in r[1] and rule in r[3])
        fp = sum(1 for r in rows if rule not in r[1] and rule in r[3])
        fn = sum(1 for r in rows if rule in r[1] and rule not in r[3])
        tp_all, fp_all, fn_all = tp_all + tp, fp_all + fp, fn_all + fn
        print(f"{rule:24} fired on {tp + fp} ({tp} expected, {fp} not: "
              f"{', '.join(r[0] for r in rows if rule not in r[1] and rule in r[3]) or '-'}), missed {fn}")
    precision = tp_all / (tp_all + fp_all) if tp_all + fp_all else 1.0
    recall = tp_all / (tp_all + fn_all) if tp_all + fn_all else 1.0
    print(f"every rule: {len(rows)} jobs, {tp_all + fp_all} findings ({tp_all} expected, {fp_all} not), missed "
          f"{fn_all}; precision {precision:.2f}, recall {recall:.2f}")


if __name__ == "__main__":
    main()
