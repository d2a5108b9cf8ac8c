"""Instructions per training step that stepscope's hooks add, counted by valgrind.

    python3 bench/instructions.py [--steps 300] [--session] [--parts | --cache] [--layouts N]

Wall-clock pairs (``bench/overhead.py --hooks``) see a hook cost of ~20 us
inside a noise of 2-7 us on a shared VM; instruction counts are exact. The
same loop as bench/overhead.py's small configuration (8-layer MLP, width 16,
batch 16, a DataLoader pass every 8 steps, SGD, one torch thread) runs under
``valgrind --tool=callgrind`` with counting switched on for N steps only
(``callgrind_control``), once without stepscope and once instrumented; the
training thread's instruction count per step is printed for both, and their
difference. ``--parts`` also runs it with one patch point taken out at a time
(what each costs). ``--session`` keeps a session running (its background
threads then take the GIL now and then, which moves the count by ~1,000 a
step between runs); without it the hooks report to their step trackers and
nothing is written, the same hot path.

Instructions are not time: a Python attribute lookup and a cache miss weigh
differently. But a change that removes instructions from every step is real,
and this count shows it in one run where wall-clock pairs need hundreds. The
count also moves by up to ~5,000 a step with memory layout (a rebuild, even a
longer argv): the interpreter's attribute caches collide and its dicts probe
depending on where strings and types were allocated. Compare a few thousand
only through ``callgrind_annotate`` of the
``cg-*.out`` files kept in --keep for which functions changed.

The usual mover is CPython's type attribute cache (4,096 entries, indexed by a
type's version tag and the attribute name's address): two lookups made every
step that land on one entry evict each other, and each miss walks the type's
MRO (``find_name_in_mro``, ~280 instructions with its dict lookups). ``--cache``
prints those misses per step ("type-cache misses"): a difference that moves
with them is layout, not work. (Issue 42: 47 misses a step against main's 14
made torch42's +6,700 with the same bytecodes, Python calls and native
instructions a step as main.) ``--layouts N`` runs each configuration N times,
the k-th with k type version tags used up before torch is imported (tags are
handed out in order, so every hot type's tag, and its cache entries, move), and
prints the median of each figure: one layout's collisions then no longer decide
the result.

``--cache`` has valgrind simulate the caches too and prints the L1 instruction
and data misses per step beside the instructions, for the whole training thread
and for the code of stepscope's native module alone: between torch's ops that
code and its data are cold, so nearly every line it touches misses, and the
misses, more than the instructions, are its time.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PARTS = ("annotations", "optimizer", "roots", "backward")


def child(what: str, steps: int, marks: str, session: bool, layout: int = 0) -> None:
    """Runs in valgrind: warms up, waits for counting to start, runs the steps."""
    os.environ["STEPSCOPE_OPS"] = "0"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    for k in range(layout):  # --layouts: a lookup on a new class hands it the next version tag
        getattr(type(f"Layout{k}", (), {}), "x", None)
    import torch

    torch.set_num_threads(1)
    import stepscope
    from overhead import make
    from stepscope.integrations import torch as st_torch

    loop = make(16, 16)
    loop(20)
    run = stepscope.start(dir=tempfile.mkdtemp(), name="instructions") if session else None
    if what != "none":
        st_torch.instrument()
        loop(5)
        take_out(st_torch.instrumentor, what)
    loop(30)  # past root discovery and the first passes
    gc.collect()  # the same start for every run: a full collection inside the window is ~100,000 a step
    open(marks + ".ready", "w").close()
    while not os.path.exists(marks + ".go"):
        time.sleep(0.05)
    loop(steps)
    open(marks + ".done", "w").close()
    while not os.path.exists(marks + ".end"):
        time.sleep(0.05)
    if run is not None:
        run.stop()
    st_torch.uninstrument()


def take_out(inst, what: str) -> None:
    """--parts: "all-but-X" puts patch point X back as torch had it."""
    if what.startswith("all-but-"):
        take_out_part(inst, what[len("all-but-"):])


def take_out_part(inst, part: str) -> None:
    for owner, name, original in list(inst._patches._patches):
        if (part == "annotations" and getattr(owner, "__name__", "") == "record_function") or \
                (part == "backward" and "backward" in name):
            setattr(owner, name, original)
    if part == "optimizer":
        for handle in inst.hook_handles:
            handle.remove()
    if part == "roots":
        inst.roots.release()
        inst.roots.fixed = True


def count(what: str, steps: int, keep: str, session: bool, cache: bool = False, layout: int = 0) -> float:
    """The training thread's instructions per step with `what` instrumented (with
    `cache`: a dict of callgrind's events per step, the simulated cache misses too)."""
    marks = os.path.join(keep, f"mark-{what}")
    out = os.path.join(keep, f"cg-{what}.out")
    if layout:
        marks, out = f"{marks}-layout{layout}", f"{out}-layout{layout}"
    for suffix in (".ready", ".go", ".done", ".end"):
        if os.path.exists(marks + suffix):
            os.remove(marks + suffix)
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"] + \
        (["--cache-sim=yes"] if cache else []) + [
           f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__), "--child", what,
           "--steps", str(steps), "--marks", marks, "--layout", str(layout)] + (["--session"] if session else [])
    # a fixed string hash seed: dict and set layouts (and their lookups' cost) then repeat
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

    def wait_for(path):
        while not os.path.exists(path):
            if proc.poll() is not None:
                raise SystemExit(f"the run under valgrind ({what}) ended early:\n{proc.stderr.read()[-3000:]}")
            time.sleep(0.2)

    wait_for(marks + ".ready")
    subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
    open(marks + ".go", "w").close()
    wait_for(marks + ".done")
    subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    open(marks + ".end", "w").close()
    proc.wait()
    main_thread = out + ".1-01"  # the dump's part 1, thread 1: the training loop
    events = []
    with open(main_thread) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            if line.startswith("totals:"):
                per_step = {e: int(v) / steps for e, v in zip(events, line.split()[1:])}
                if cache:
                    per_step["ours"] = own_events(main_thread, events, steps)
                    per_step["type-cache misses"] = type_cache_misses(main_thread) / steps
                    return per_step
                return per_step["Ir"]
    raise SystemExit(f"no totals in {main_thread}")


def type_cache_misses(path: str) -> int:
    """Calls of CPython's find_name_in_mro in a callgrind file: the misses of the type
    attribute cache (its hits never call it). The file names a function once, as
    ``fn=(id) name`` or ``cfn=(id) name``, then by its id alone; a call is the
    ``calls=N ...`` line after its ``cfn=``."""
    names, calls, counting = {}, 0, False
    with open(path) as f:
        for line in f:
            if line.startswith(("fn=", "cfn=")):
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
                if m:
                    if m.group(2):
                        names[m.group(1)] = m.group(2).strip()
                    counting = line.startswith("cfn=") and names.get(m.group(1), "").startswith("find_name_in_mro")
            elif counting and line.startswith("calls="):
                calls += int(line.split()[0][len("calls="):])
                counting = False
    return calls


def own_events(path: str, events: list, steps: int) -> dict:
    """Per step, the events of the code in stepscope's native module alone (self cost,
    its PLT stubs included), as callgrind_annotate lists them."""
    out = subprocess.run(["callgrind_annotate", f"--show={','.join(events)}", "--threshold=100",
                          "--inclusive=no", "--auto=no", path], capture_output=True, text=True, check=True).stdout
    own = dict.fromkeys(events, 0)
    for line in out.splitlines():
        # the object is named at the end of a function's first line; a debug build also
        # lists inlined pieces by their header, with the function's name alone
        if "stepscope/core/_native" not in line and "stepscope::" not in line:
            continue
        # "1,234 (0.5%)  56 (0.1%)  . ... file:function": the counts come first ("." is 0)
        values = [v.replace(",", "").replace(".", "0") for v in re.sub(r"\([^)]*\)", " ", line.split(":")[0]).split()]
        if len(values) >= len(events) and all(v.isdigit() for v in values[:len(events)]):
            for e, v in zip(events, values):
                own[e] += int(v)
    return {e: v / steps for e, v in own.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--session", action="store_true", help="keep a session running (background threads)")
    parser.add_argument("--parts", action="store_true", help="also each patch point taken out in turn")
    parser.add_argument("--cache", action="store_true",
                        help="simulate the caches too (--cache-sim=yes): L1 misses per step, all and stepscope's own")
    parser.add_argument("--keep", help="a folder for the callgrind files (default: a temporary one)")
    parser.add_argument("--layouts", type=int, default=1,
                        help="run each configuration in N memory layouts and print the medians")
    parser.add_argument("--layout", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--marks", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.steps, args.marks, args.session, args.layout)
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("bench/instructions.py: skipped, it needs valgrind (apt install valgrind)")
        return
    keep = args.keep or tempfile.mkdtemp(prefix="stepscope-instructions-")
    os.makedirs(keep, exist_ok=True)
    if args.cache:
        return cache_table(args.steps, keep, args.session, args.layouts)
    layouts = range(max(1, args.layouts))
    nones = [count("none", args.steps, keep, args.session, layout=k) for k in layouts]
    fulls = [count("stepscope", args.steps, keep, args.session, layout=k) for k in layouts]
    none, full = statistics.median(nones), statistics.median(fulls)
    print(f"instructions per step, training thread, {args.steps} steps"
          f"{' (session running)' if args.session else ''}; callgrind files in {keep}")
    if len(layouts) > 1:
        print(f"medians of {len(layouts)} layouts; stepscope's part in each: "
              + ", ".join(f"{f - n:,.0f}" for n, f in zip(nones, fulls)))
    print("| run | per step | stepscope's part |")
    print("| --- | ---: | ---: |")
    print(f"| no stepscope | {none:,.0f} | |")
    print(f"| stepscope | {full:,.0f} | {full - none:,.0f} |")
    if args.parts:
        for part in PARTS:
            without = count(f"all-but-{part}", args.steps, keep, args.session)
            print(f"| stepscope without {part} | {without:,.0f} | {part}: {full - without:,.0f} |", flush=True)


def cache_table(steps: int, keep: str, session: bool, layouts: int = 1) -> None:
    """--cache: instructions and simulated L1 misses (32 KiB, 8-way each, as valgrind
    models this host's caches) per step. Between torch's ops the hooks' code and data
    are cold: nearly every line they touch misses, and the misses, not the
    instructions, are most of their time."""
    runs = [(count("none", steps, keep, session, cache=True, layout=k),
             count("stepscope", steps, keep, session, cache=True, layout=k)) for k in range(max(1, layouts))]
    none, full = median_events([n for n, _ in runs]), median_events([f for _, f in runs])
    shown = ("Ir", "I1mr", "D1mr", "D1mw")
    misses = "type-cache misses"
    print(f"per step, training thread, {steps} steps{' (session running)' if session else ''}, "
          f"simulated caches; callgrind files in {keep}")
    print("| run | " + " | ".join(shown) + f" | {misses} |")
    print("| --- |" + " ---: |" * (len(shown) + 1))
    print("| no stepscope | " + " | ".join(f"{none[e]:,.0f}" for e in shown) + f" | {none[misses]:.1f} |")
    print("| stepscope | " + " | ".join(f"{full[e]:,.0f}" for e in shown) + f" | {full[misses]:.1f} |")
    print("| difference | " + " | ".join(f"{full[e] - none[e]:,.0f}" for e in shown) +
          f" | {full[misses] - none[misses]:.1f} |")
    print("| stepscope's native functions alone | " + " | ".join(f"{full['ours'][e]:,.0f}" for e in shown) + " | |")
    if len(runs) > 1:
        print(f"medians of {len(runs)} layouts; per layout, Ir difference (type-cache misses): " + ", ".join(
            f"{f['Ir'] - n['Ir']:,.0f} ({f[misses] - n[misses]:.1f})" for n, f in runs))


def median_events(runs: list) -> dict:
    """Each event's median over the layouts' runs (the native functions' events too)."""
    out = {e: statistics.median(r[e] for r in runs) for e in runs[0] if e != "ours"}
    out["ours"] = {e: statistics.median(r["ours"][e] for r in runs) for e in runs[0]["ours"]}
    return out


if __name__ == "__main__":
    main()
