"""The native step tracker (csrc/steps/) and the other native types reachable
from Python raise on misuse, never crash (issue 41, item 3).

Every report may call Python (the guess, on_new_step, may_begin, the operator
windows' ops_step, a user key's __eq__ or __hash__), and that Python may close,
reset or re-enter the tracker, or another thread may close it meanwhile (session
stop closes every thread's tracker). Each case runs in a subprocess: a crash
fails the test instead of killing pytest. Hypothesis generates the call
sequences inside that subprocess (a fixed seed in the fast suite).
"""

import textwrap

import pytest

from conftest import run_python

PRELUDE = """
    import faulthandler, sys, threading
    faulthandler.enable()
    import stepscope
    from stepscope.core import _native
    from stepscope.integrations._steps import StepTracker
"""


def run_clean(code, tmp_path, timeout=120, env=None):
    """Runs PRELUDE + code in a fresh interpreter; asserts it exited cleanly, with
    no SystemError (the C API misused) anywhere in its output. Returns stdout."""
    r = run_python(textwrap.dedent(PRELUDE) + textwrap.dedent(code), cwd=tmp_path, timeout=timeout,
                   env={"STEPSCOPE_DIR": str(tmp_path / "runs"), **(env or {})})
    output = r.stdout + r.stderr
    assert r.returncode == 0, f"exit {r.returncode}\n{output[-6000:]}"
    assert "SystemError" not in output and "Fatal Python error" not in output, output[-6000:]
    return r.stdout


# --- the review's reproduction: a callback during which the tracker is closed -----------


def test_a_guess_during_which_another_thread_closes_the_tracker(tmp_path):
    """fetched -> both_train -> guess(): meanwhile session stop's thread runs close(tid);
    the held-back fetch is gone when guess returns (a NULL dereference before)."""
    out = run_clean("""
        run = stepscope.start(name="closed")
        t = StepTracker()
        t.optimizer_known(1)
        asked, closed = threading.Event(), threading.Event()

        def closer():
            asked.wait()
            t.close(threading.get_native_id())  # another thread's close, as at session stop
            closed.set()

        def guess():
            asked.set()
            closed.wait()  # releases the GIL: the other thread closes the tracker now
            return "eval"

        other = threading.Thread(target=closer)
        other.start()
        t.fetched(10, 20, "train")
        t.forward_started("train", 30)
        t.forward_ended("train", 30, 40)
        t.backward_started(40)
        t.backward_ended(40, 50)
        t.optimizer_started(1, 50)
        t.optimizer_ended(1, 50, 60)
        t.fetched(70, 80, "train")  # held back: its work has not shown yet
        t.guess = guess
        t.fetched(90, 100, None)  # asks the guess: an eval fetch ends the held-back one
        other.join()
        print("after", t.mode, t.pending, t.in_step(), t.done)
        run.stop()
        r = stepscope.load(run.path)
        print("steps", r.steps["mode"].tolist())
    """, tmp_path)
    # the close dropped the step's state; the fetch reported after it is held back afresh
    assert "after None (90, 100, None) True False" in out
    assert "steps ['train']" in out


CALLBACK_CLOSES = """
    run = stepscope.start(name="callbacks")
    what = sys.argv[-1] if len(sys.argv) > 1 else ""
    results = []

    def closing(t, returns):
        def callback(*args):
            t.close()
            t.reset()
            return returns
        return callback

    class ClosingKey:  # an optimizer key whose comparisons close the tracker
        def __init__(self, t):
            self.t = t
        def __hash__(self):
            return 1
        def __eq__(self, other):
            self.t.close()
            return self is other

    def train_step(t, at, key=1):
        t.fetched(at, at + 1, "train")
        t.forward_started("train", at + 2)
        t.forward_ended("train", at + 2, at + 3)
        t.backward_started(at + 3)
        t.backward_ended(at + 3, at + 4)
        t.optimizer_started(key, at + 4)
        t.optimizer_ended(key, at + 4, at + 5)

    for name in ("guess", "on_new_step", "may_begin"):
        t = StepTracker()
        t.optimizer_known(1)
        setattr(t, name, closing(t, "eval" if name == "guess" else True))
        train_step(t, 10)
        t.fetched(20, 21, "train")
        t.fetched(22, 23, None)  # the guess
        t.fetched(24, 25, "eval")
        t.forward_started("eval", 26)
        train_step(t, 30)
        t.exhausted(40, 41)
        results.append((name, t.mode, t.pending))

    class Windowed(StepTracker):  # an operator window open: ops_step at every step begin
        __slots__ = ()
        ops_due = 0

    t = Windowed()
    Windowed.ops_step = staticmethod(closing(t, None))
    for at in (10, 20, 30):
        train_step(t, at)
    results.append(("ops_step", t.mode, t.pending))

    t = StepTracker()
    a, b = ClosingKey(t), ClosingKey(t)
    t.optimizer_known(a)
    t.optimizer_known(b)  # a hash collision: a == b asked
    for at in (10, 20, 30):
        train_step(t, at, key=a)
        train_step(t, at + 5, key=b)
    results.append(("key", t.mode, t.pending))
    run.stop()
    print(results)
    print("steps", len(stepscope.load(run.path).steps))
"""


def test_callbacks_that_close_and_reset_the_tracker_inside_every_report(tmp_path):
    out = run_clean(CALLBACK_CLOSES, tmp_path)
    assert "steps " in out
    results = eval(out.splitlines()[0])
    assert [r[0] for r in results] == ["guess", "on_new_step", "may_begin", "ops_step", "key"]
    # every tracker ends usable, its state whole (a mode, a pending fetch or None)
    assert all(mode in (None, "train", "eval") for _, mode, _ in results)


# --- misuse of the public type ---------------------------------------------------------


def test_a_tracker_made_without_init_reads_and_reports(tmp_path):
    out = run_clean("""
        t = _native.StepTracker.__new__(_native.StepTracker)  # no __init__
        print(t.mode, t.pending, t.pending_more, t.optimizers_known, t.optimizers_in_step, t.optimizers_before,
              t.guess, t.on_new_step, t.may_begin, t.every_step, t.in_step())
        class NoInit(StepTracker):
            __slots__ = ()
            def __init__(self):
                pass  # a subclass that skips the base's
        for t in (_native.StepTracker.__new__(StepTracker), NoInit()):
            t.optimizer_known(1)
            t.fetched(10, 20, "train")
            t.forward_started("train", 30)
            t.backward_started(40)
            t.optimizer_started(1, 50)
            t.optimizer_ended(1, 50, 60)
            t.fetched(70, 80, None)
            t.exhausted(90, 100)  # read ahead of its work (an optimizer known): still this step's
            print(t.mode, t.pending, t.pending_more, sorted(t.optimizers_known), t.last_end)
            t.close()
            print(t.mode, t.pending, t.in_step(), t.last_end)
    """, tmp_path)
    assert out.splitlines() == ["None None [] set() set() set() None None None True False"] + [
        "train (70, 80, None) [(90, 100)] [1] 60", "None None False 0"] * 2


def test_tracker_attributes_are_typed_and_never_deleted(tmp_path):
    out = run_clean("""
        def outcome(f):
            try:
                f()
                return "ok"
            except (TypeError, AttributeError, ValueError) as e:
                return type(e).__name__

        t = StepTracker()
        rows = []
        for name in ("pending_more", "optimizers_known", "optimizers_in_step", "optimizers_before"):
            rows.append((name, outcome(lambda: delattr(t, name)),
                         outcome(lambda: setattr(t, name, {1} if name == "pending_more" else [1])),
                         outcome(lambda: setattr(t, name, None))))
        for name in ("guess", "on_new_step", "may_begin"):
            rows.append((name, outcome(lambda: setattr(t, name, 3)), outcome(lambda: delattr(t, name)),
                         getattr(t, name)))
        for name in ("done", "fed", "worked", "background", "last_end", "prefetched"):
            rows.append((name, outcome(lambda: delattr(t, name)), outcome(lambda: setattr(t, name, "x"))))
        rows.append(("pending", outcome(lambda: setattr(t, "pending", (1, "x", "train"))),
                     outcome(lambda: setattr(t, "pending", [1, 2, 3]))))
        # the reports after all that still run, on the attributes as they were
        t.optimizer_known(1)
        t.fetched(10, 20, "train")
        t.fetched(30, 40, "train")
        t.pending_more = [(1, "x")]
        rows.append(("bad pair", outcome(lambda: t.forward_started("train", 50))))
        rows.append(("phase", outcome(lambda: t.forward_ended("train", 50, 60, 99)),
                     outcome(lambda: t.forward_ended("train", 50, 60, 2**32 + 1))))
        print(rows)
        print(t.mode, t.pending, t.pending_more)
    """, tmp_path)
    rows = eval(out.splitlines()[0])
    assert rows[:4] == [(name, "AttributeError", "TypeError", "TypeError")
                        for name in ("pending_more", "optimizers_known", "optimizers_in_step", "optimizers_before")]
    assert rows[4:7] == [(name, "TypeError", "ok", None) for name in ("guess", "on_new_step", "may_begin")]
    assert all(r[1:] == ("TypeError", "TypeError") for r in rows[7:13]), rows[7:13]
    assert rows[13] == ("pending", "TypeError", "TypeError")
    assert rows[14] == ("bad pair", "TypeError")
    assert rows[15] == ("phase", "ValueError", "ValueError")  # no span of another name as a phase
    assert out.splitlines()[1] == "train None []"


# --- the other native types reachable from Python ----------------------------------------

AUDIT = """
    import weakref
    failures = []

    class Compiler:
        _is_compiling_flag = False

    def broken_states():
        yield _native.torch.LoopState.__new__(_native.torch.LoopState)  # no __init__
        for name in ("stack", "forced_modes", "iter_started", "setting_mode", "pending_root", "tracker"):
            for value in (None, 7, "train", object(), [1, 2], {}):
                s = _native.torch.LoopState(StepTracker())
                try:
                    setattr(s, name, value)
                except (TypeError, AttributeError):
                    pass
                yield s
            s = _native.torch.LoopState(StepTracker())
            delattr(s, name)
            yield s
        for name in ("depth", "in_backward", "in_optimizer"):
            for value in (-1, 2**40):
                s = _native.torch.LoopState(StepTracker())
                setattr(s, name, value)
                yield s

    class Module:
        training = True

    module = Module()
    calls = 0
    for state in broken_states():
        class Local:
            s = state
            stack = [1]
        def passed(*a, **k):
            return "through"
        loop = (Local, ("fetch#",), ("zero#",), 0, _native.intern("x"))
        enter = _native.torch.filtered_enter(lambda self: "in", lambda *a: None, ("own#",), failures.append, loop)
        exit_ = _native.torch.guarded_exit(lambda self, *e: False, lambda *a: None, Local, failures.append, loop)
        backward = _native.torch.timed_backward(passed, Local, Compiler, failures.append)
        root = _native.torch.timed_root(weakref.ref(module), None, lambda m, *a, **k: "through", Local, None,
                                  lambda: True, lambda m: True, Compiler, failures.append, False, (1, 5))
        iter_ = _native.torch.timed_iter(lambda self: iter([1, 2]), Local, set(), passed, passed, failures.append)
        pre = _native.torch.optimizer_hook(Local, Compiler, None, failures.append, False)
        post = _native.torch.optimizer_hook(Local, Compiler, None, failures.append, True)
        class Range:
            name = "fetch#1"
        for call in (lambda: enter(Range()), lambda: exit_(Range(), None, None, None), lambda: backward(1),
                     lambda: root(1), lambda: list(iter_(Range())), lambda: pre(object(), (), {}),
                     lambda: post(object(), (), {}), lambda: _native.torch.optimizer_began(Local, 1),
                     lambda: _native.torch.optimizer_done(Local, 1), lambda: _native.torch.loop_state(Local)):
            try:
                call()
            except (TypeError, AttributeError, ValueError):
                pass
            calls += 1
        _native.torch.loop_states_changed()

    span = _native.annotate("x")
    for misuse in (lambda: type(span).__new__(type(span)), lambda: setattr(span, "name", "y"),
                   lambda: delattr(span, "name"), lambda: span(3), lambda: span.__exit__(1, 2, 3),
                   lambda: _native.annotation_end(12345), lambda: _native.annotation_end("x"),
                   lambda: type(enter).__new__(type(enter)), lambda: type(root).__new__(type(root)),
                   lambda: type(iter_).__new__(type(iter_)), lambda: type(pre).__new__(type(pre))):
        try:
            misuse()
        except (TypeError, AttributeError, ValueError, RuntimeError):
            pass
        calls += 1

    # each wrapper made with one argument of a wrong type, then called: TypeError (made
    # or called) or a failure handed to fail(), never a crash
    class Local:
        s = _native.torch.LoopState(StepTracker())
        stack = [1]
    loop = (Local, ("fetch#",), ("zero#",), 0, _native.intern("x"))
    def passed(*a, **k):
        return "through"
    valid = {
        "filtered_enter": ((lambda self: "in", lambda *a: None, ("own#",), failures.append, loop),
                           lambda w: w(Range())),
        "guarded_exit": ((lambda self, *e: False, lambda *a: None, Local, failures.append, loop),
                         lambda w: w(Range(), None, None, None)),
        "timed_backward": ((passed, Local, Compiler, failures.append), lambda w: w(1)),
        "timed_root": ((weakref.ref(module), None, lambda m, *a, **k: "through", Local, None, lambda: True,
                        lambda m: True, Compiler, failures.append, False, (1, 5)), lambda w: w(1)),
        "timed_iter": ((lambda self: iter([1, 2]), Local, set(), passed, passed, failures.append),
                       lambda w: list(w(Range()))),
        "optimizer_hook": ((Local, Compiler, None, failures.append, False), lambda w: w(object(), (), {})),
    }
    junk = [None, 7, "x", object(), (), ("a", 1), (1, 2, 3, 4, 5), [], weakref.ref(Compiler), lambda *a: 1 / 0]
    made = 0
    for name, (args, call) in valid.items():
        for i in range(len(args)):
            for wrong in junk:
                bad = list(args)
                bad[i] = wrong
                try:
                    wrapper = getattr(_native.torch, name)(*bad)
                    made += 1
                    call(wrapper)
                except (TypeError, ValueError, AttributeError, ZeroDivisionError):
                    pass
    print("calls", calls, "made", made, "failures", len(failures),
          "kinds", sorted({type(f).__name__ for f in failures}))
"""


def test_the_other_native_types_raise_on_misuse(tmp_path):
    out = run_clean(AUDIT, tmp_path)
    calls = int(out.split()[1])
    assert calls == (1 + 6 * 7 + 3 * 2) * 10 + 11
    assert int(out.split()[3]) > 100  # wrappers made with a wrong argument, and called
    # what the wrappers could not do reached fail(), as a Python error (no SystemError)
    assert "SystemError" not in out.split("kinds", 1)[1]


# --- random call sequences from several threads ---------------------------------------------

FUZZ = """
    import random
    from hypothesis import HealthCheck, given, seed, settings, strategies as st

    SEED, EXAMPLES, LAST = {seed}, {examples}, {last!r}
    sys.setswitchinterval(1e-5)  # threads switch often: callbacks interleave with reports
    sys.setrecursionlimit(400)

    class Boom(Exception):
        pass

    # what a misused or failing tracker may raise; anything else (SystemError) is a bug
    EXPECTED = (TypeError, ValueError, AttributeError, OverflowError, RuntimeError, RecursionError, Boom)
    unexpected = []

    class World:
        # the objects of one example: the tracker, and callbacks, modes and keys that act on it
        def __init__(self, tracker):
            self.t = tracker
            self.clock = 100
            self.depth = threading.local()

        def now(self):
            self.clock += 7
            return self.clock

        def act(self, action):
            # what a callback does to the tracker; nested a few levels at most
            depth = getattr(self.depth, "n", 0)
            if depth > 3:
                return
            self.depth.n = depth + 1
            t = self.t
            try:
                if action == "close":
                    t.close()
                elif action == "close_other":
                    t.close(threading.get_native_id())
                elif action == "reset":
                    t.reset()
                elif action == "suspend":
                    t.suspend()
                elif action == "resume":
                    t.resume()
                elif action == "raise":
                    raise Boom("from a callback")
                elif action == "fetch":
                    t.fetched(self.now(), self.now(), None)
                elif action == "forward":
                    t.forward_started("train", self.now())
                elif action == "optimizer":
                    t.optimizer_started(1, self.now())
                    t.optimizer_ended(1, self.now(), self.now())
                elif action == "drop_pending":
                    t.pending = None
                elif action == "swap_sets":
                    t.optimizers_known, t.optimizers_in_step, t.optimizers_before = set(), {{1}}, set()
                elif action == "swap_more":
                    t.pending_more = [(1, 2)]
                elif action == "no_guess":
                    t.guess = None
            finally:
                self.depth.n = depth

    ACTIONS = ["none", "close", "close_other", "reset", "suspend", "resume", "raise", "fetch", "forward",
               "optimizer", "drop_pending", "swap_sets", "swap_more", "no_guess"]

    def make(world, token):
        # a token of the program -> the object it stands for in this world
        kind, value = token
        if kind == "tick":
            return world.now() if value == "now" else value
        if kind == "plain":
            return value
        if kind == "callback":
            action, returns = value
            def callback(*args):
                world.act(action)
                return make(world, returns)
            return callback
        if kind == "acting":  # a user object whose hash, comparison or truth acts on the tracker
            base, action = value
            class Acting(str if isinstance(base, str) else object):
                def __hash__(self):
                    world.act(action)
                    return hash(base)
                def __eq__(self, other):
                    world.act(action)
                    return base == other
                def __bool__(self):
                    world.act(action)
                    return True
            return Acting(base) if isinstance(base, str) else Acting()
        raise AssertionError(kind)

    actions = st.sampled_from(ACTIONS)
    plain_modes = st.sampled_from(["train", "train", "eval", "predict", None, 7, (), "", "x" * 40])
    returns = st.one_of(plain_modes.map(lambda m: ("plain", m)), st.just(("plain", True)),
                        st.just(("plain", False)))
    callbacks = st.tuples(actions, returns).map(lambda v: ("callback", v))
    acting = st.tuples(st.sampled_from(["train", "eval", 1]), actions).map(lambda v: ("acting", v))
    ticks = st.one_of(st.just(("tick", "now")), st.just(("tick", "now")), st.just(("tick", "now")),
                      st.sampled_from([0, 1, -1, 2**63, 2**64 - 1, 2**64, "x", None, 1.5, True]).map(
                          lambda v: ("tick", v)))
    modes = st.one_of(plain_modes.map(lambda m: ("plain", m)), acting, st.just(("plain", [])))
    keys = st.one_of(st.sampled_from([1, 1, 2, "k", None, (), frozenset({{1}})]).map(lambda k: ("plain", k)),
                     acting, st.just(("plain", [])))
    parts = st.sampled_from([None, "g1", "g2", 0]).map(lambda v: ("plain", v))
    phases = st.sampled_from([0, 1, 1, 2, 3, 4, 5, 6, 99, 2**32 + 1, -1, "x"]).map(lambda v: ("plain", v))
    anything = st.one_of(ticks, modes, keys, callbacks)
    tids = st.sampled_from([0, 0, 1, 2**40, -1, "x"]).map(lambda v: ("tick", v))

    def report(name, *args):
        # a report's arguments: the valid forms, and the arity sometimes wrong
        return st.tuples(st.just(name), st.tuples(*args), st.sampled_from([0, 0, 0, 0, 1, -1]))

    calls = st.one_of(
        report("fetched", ticks, ticks, modes), report("exhausted", ticks, ticks), report("loop_started"),
        report("loop_ended", ticks), report("forward_started", modes, ticks, parts, parts, anything),
        report("forward_started", modes, ticks, parts, parts), report("forward_ended", modes, ticks, ticks,
                                                                      phases, parts, parts),
        report("loss", ticks, ticks), report("backward_started", ticks, anything),
        report("backward_ended", ticks, ticks),
        report("optimizer_known", keys), report("optimizer_used"), report("optimizer_started", keys, ticks),
        report("optimizer_ended", keys, ticks, ticks), report("phase_start", modes, ticks), report("in_step"),
        report("close", tids), report("suspend"), report("resume"), report("reset"),
        st.tuples(st.just("set"), st.tuples(st.sampled_from(
            ["guess", "on_new_step", "may_begin", "pending", "pending_more", "optimizers_known",
             "optimizers_in_step", "optimizers_before", "done", "fed", "worked", "background", "every_step",
             "suspended", "last_end", "forwards_in_step", "prefetched", "mode", "mark"]),
            st.one_of(callbacks, anything, st.sampled_from(
                [set(), {{1, 2}}, [], [(1, 2)], [(1, "x")], [3], (1, 2, "train"), (1, 2), True, False, 0, -1,
                 2**70]).map(lambda v: ("plain", v)))), st.just(0)),
        st.tuples(st.just("del"), st.tuples(st.sampled_from(
            ["guess", "on_new_step", "may_begin", "pending", "pending_more", "optimizers_known", "done",
             "last_end", "mode"])), st.just(0)),
        st.tuples(st.just("get"), st.tuples(st.sampled_from(
            ["mode", "pending", "mark", "candidate", "forward_end", "pending_more", "optimizers_known",
             "optimizers_in_step", "optimizers_before", "guess", "last_end", "prefetched"])), st.just(0)),
    )
    programs = st.fixed_dictionaries({{
        "threads": st.lists(st.lists(calls, max_size=25), min_size=1, max_size=3),
        "guess": callbacks, "on_new_step": callbacks, "may_begin": callbacks,
        "ops_due": st.sampled_from([1 << 62, 1 << 62, 0, 1, 3]), "ops_step": callbacks,
        "subclass": st.booleans(),
    }})

    class Windowed(StepTracker):
        __slots__ = ()

    def run_call(world, call):
        name, tokens, arity = call
        args = [make(world, token) for token in tokens]
        t = world.t
        if name == "set":
            setattr(t, args[0], args[1])
        elif name == "del":
            delattr(t, args[0])
        elif name == "get":
            getattr(t, args[0])
        else:
            if arity < 0:
                args = args[:arity]
            elif arity > 0:
                args.append(world.now())
            getattr(t, name)(*args)

    def run_thread(world, program):
        for call in program:
            try:
                run_call(world, call)
            except EXPECTED:
                pass
            except BaseException as e:
                unexpected.append((call, repr(e)))

    run = stepscope.start(name="fuzz")

    @seed(SEED)
    @settings(max_examples=EXAMPLES, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(programs)
    def test(program):
        with open(LAST, "w") as f:  # the example a crash interrupted
            f.write(repr(program))
        unexpected.clear()
        Windowed.ops_due = program["ops_due"]
        cls = Windowed if program["subclass"] else StepTracker
        world = World(None)
        Windowed.ops_step = staticmethod(make(world, program["ops_step"]))
        try:
            world.t = cls(make(world, program["on_new_step"]), make(world, program["may_begin"]))
            world.t.guess = make(world, program["guess"])
        except EXPECTED:
            world.t = cls()
        threads = [threading.Thread(target=run_thread, args=(world, p)) for p in program["threads"]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive(), "a thread hangs"
        for report_name in ("close", "reset"):  # the tracker still works at the end
            try:
                getattr(world.t, report_name)()
            except EXPECTED:
                pass
        assert not unexpected, unexpected[:3]

    test()
    run.stop()
    r = stepscope.load(run.path)  # the profile the fuzzed trackers wrote is readable
    print("FUZZ OK", EXAMPLES, "steps", len(r.steps))
"""


def fuzz(tmp_path, seed, examples, timeout):
    last = tmp_path / "last_example.txt"
    code = FUZZ.format(seed=seed, examples=examples, last=str(last))
    try:
        # the Python sampler off: its walk of thousands of short-lived threads' stacks is
        # another component's (a crash there would hide the tracker's)
        out = run_clean(code, tmp_path, timeout=timeout, env={"STEPSCOPE_PYSAMPLE_HZ": "0"})
    except AssertionError as e:
        interrupted = last.read_text() if last.exists() else "(none)"
        raise AssertionError(f"{e}\nthe example running: {interrupted[:4000]}") from None
    assert f"FUZZ OK {examples} steps" in out, out[-2000:]


def test_random_call_sequences_from_threads_never_crash(tmp_path):
    fuzz(tmp_path, seed=41, examples=400, timeout=150)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_random_call_sequences_from_threads_never_crash_long(tmp_path, seed):
    fuzz(tmp_path, seed=seed, examples=3000, timeout=280)
