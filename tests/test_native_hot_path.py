"""The native pieces of the per-step hot path, without a framework: the step
tracker (csrc/steps/) fed the reports an integration makes, read back from a
real run; the method wrappers (csrc/torch/record_function.cc) on a plain context manager."""

import weakref

import pytest

import stepscope
from stepscope.core import _native
from stepscope.integrations._steps import FORWARD, StepTracker


def _tick_ns():
    return _native.clock_info()["ticks_per_ns"]


def _clock():
    """advance(ns) -> (t0, t1): the next ns of a made-up timeline, in ticks from now."""
    tpn, t = _tick_ns(), [_native.now()]

    def advance(ns):
        t0 = t[0]
        t[0] += int(ns * tpn)
        return t0, t[0]

    return advance


def _loss_backward_optimizer(tracker, advance, backward_ns):
    """A train step's end, reported: a 0.5 ms loss, the backward, a 1 ms optimizer step (key 1)."""
    tracker.loss(*advance(500_000))
    t0, t1 = advance(backward_ns)
    tracker.backward_started(t0)
    tracker.backward_ended(t0, t1)
    t0, t1 = advance(1_000_000)
    tracker.optimizer_started(1, t0)
    tracker.optimizer_ended(1, t0, t1)


def test_tracker_makes_contiguous_steps_from_phase_reports(run_dir):
    run = stepscope.start(name="tracker")
    tracker = StepTracker()
    advance = _clock()

    for _ in range(4):  # a loader-driven loop: fetch, zero_grad, forward, loss, backward, step
        tracker.fetched(*advance(1_000_000), "train")
        tracker.optimizer_known(1)
        t0, t1 = advance(2_000_000)
        tracker.forward_started("train", t0)
        tracker.forward_ended("train", t0, t1)
        _loss_backward_optimizer(tracker, advance, backward_ns=3_000_000)
    assert tracker.mode == "train" and tracker.done and tracker.pending is None
    tracker.exhausted(*advance(100_000))
    assert tracker.mode is None and not tracker.in_step()
    run.stop()

    r = stepscope.load(run.path)
    steps = r.steps
    assert steps["step"].tolist() == [0, 1, 2, 3] and set(steps["mode"]) == {"train"}
    # each step runs from its fetch to the next fetch; the last to where the fetch that met the
    # loader's end began: that call is after the loop (SPEC §3), named
    assert steps["duration_ns"].tolist() == pytest.approx([7_500_000] * 4, rel=1e-3)
    ph = r.events[r.events["category"] == "phase"]
    counts = ph["name"].astype(str).value_counts().to_dict()
    assert counts == {"GetNext": 4, "Forward": 4, "Loss": 4, "Backward": 4, "Optimizer": 4}
    assert ph.groupby("step").size().tolist() == [5, 5, 5, 5]
    end = r.events[r.events["name"] == "end of data"]
    assert len(end) == 1 and end["duration_ns"].iloc[0] == pytest.approx(100_000, rel=1e-3)
    assert end["start_ns"].iloc[0] == steps["end_ns"].iloc[3]


def test_parts_of_a_directly_called_forward_are_one_forward(run_dir):
    """Roots of one group (the submodules of a forward the program called directly):
    their forwards are one Forward span, written when anything else is reported; the
    first part starting again is the next forward (an eval step each, no loader)."""
    run = stepscope.start(name="parts")
    tracker = StepTracker()
    advance = _clock()

    group, first, second = object(), object(), object()
    spans = []
    for _ in range(3):  # train: fetch, two parts, loss, backward, optimizer
        tracker.fetched(*advance(1_000_000), "train")
        tracker.optimizer_known(1)
        for part in (first, second):
            t0, t1 = advance(1_000_000)
            tracker.forward_started("train", t0, group, part)
            tracker.forward_ended("train", t0, t1, FORWARD, group, part)
            spans.append((t0, t1))
        advance(200_000)  # the forward's own code after its last part
        _loss_backward_optimizer(tracker, advance, backward_ns=2_000_000)
    tracker.exhausted(*advance(100_000))
    for _ in range(2):  # eval, no loader: the first part again is the next forward
        for part in (first, second):
            t0, t1 = advance(1_000_000)
            tracker.forward_started("eval", t0, group, part)
            tracker.forward_ended("eval", t0, t1, FORWARD, group, part)
    tracker.close()
    run.stop()

    r = stepscope.load(run.path)
    assert r.steps["mode"].tolist() == ["train"] * 3 + ["eval"] * 2
    forwards = r.phases[r.phases["name"] == "Forward"].sort_values("start_ns")
    assert len(forwards) == 5
    # one span from the first part's start to the second's end: 2 ms each
    assert (forwards["duration_ns"] // 1000).tolist() == pytest.approx([2_000] * 5, abs=2)


def test_tracker_state_reads_and_bad_reports_raise():
    tracker = StepTracker()
    assert (tracker.mode, tracker.pending, tracker.mark, tracker.candidate, tracker.forward_end) == (None,) * 5
    tracker.fetched(10, 20, "eval")
    assert tracker.pending == (10, 20, "eval") and tracker.in_step()
    with pytest.raises(TypeError):
        tracker.fetched("soon", 20, "eval")
    with pytest.raises(TypeError):
        tracker.backward_ended(1)
    tracker.pending = None
    assert not tracker.in_step()
    # a subclass may replace a report (tests inject failures so)
    calls = []

    class Recording(StepTracker):
        __slots__ = ()

        def backward_ended(self, t0, t1):
            calls.append((t0, t1))

    Recording().backward_ended(1, 2)
    assert calls == [(1, 2)]


class _Range:
    def __init__(self, name):
        self.name = name
        self.entered = self.exited = 0

    def __enter__(self):
        self.entered += 1
        return "entered"

    def __exit__(self, *exc):
        self.exited += 1
        return False


def test_method_wrappers_pass_over_prefixes_and_never_raise_what_record_raises():
    enter, exit_ = vars(_Range)["__enter__"], vars(_Range)["__exit__"]
    pushed, popped, failures = [], [], []

    class Local:
        stack = []

    def push(name, key):
        if name == "bad":
            raise RuntimeError("record failed")
        pushed.append((name, key))
        Local.stack.append(key)

    def pop(key):
        popped.append(key)
        Local.stack.remove(key)

    class Wrapped(_Range):
        __enter__ = _native.torch.filtered_enter(enter, push, ("own#", "mine:"), failures.append)
        __exit__ = _native.torch.guarded_exit(exit_, pop, Local, failures.append)

    assert Wrapped.__enter__ is enter and Wrapped.__exit__ is exit_  # the class shows the originals
    user = Wrapped("user range")
    with user as value:
        assert value == "entered" and Local.stack == [id(user)]
    assert pushed == [("user range", id(user))] and popped == [id(user)]
    assert (user.entered, user.exited) == (1, 1)
    for passed_over in (Wrapped("own#step"), Wrapped("mine:x")):
        with passed_over:
            pass
        assert (passed_over.entered, passed_over.exited) == (1, 1)
    assert len(pushed) == 1 and len(popped) == 1 and not failures
    bad = Wrapped("bad")
    with bad as value:
        assert value == "entered"
    assert [str(f) for f in failures] == ["record failed"] and (bad.entered, bad.exited) == (1, 1)
    with pytest.raises(KeyError):  # what the block raises still reaches the caller
        with Wrapped("raising"):
            raise KeyError("from the block")


class _Reports(StepTracker):
    __slots__ = ()
    calls = []

    def fetched(self, t0, t1, mode):
        self.calls.append(("fetched", t1 >= t0 > 0, mode))

    def exhausted(self, t0, t1):
        self.calls.append(("exhausted", t1 >= t0 > 0))

    def optimizer_used(self):
        self.calls.append(("optimizer_used",))

    def backward_started(self, now, begins_step):
        self.calls.append(("backward_started", begins_step))

    def backward_ended(self, t0, t1):
        self.calls.append(("backward_ended", t1 >= t0 > 0))


def test_loop_ranges_report_fetches_and_zero_grads_to_the_threads_tracker(run_dir):
    enter, exit_ = vars(_Range)["__enter__"], vars(_Range)["__exit__"]
    failures, _Reports.calls = [], []

    class State:
        s = _native.torch.LoopState(_Reports())

    class Local:
        stack = []

    zero_grad = _native.intern("Optimizer.zero_grad")
    framework = _native.CATEGORIES.index("framework")
    loop = (State, ("fetch#",), ("zero#",), framework, zero_grad)

    class Wrapped(_Range):
        __enter__ = _native.torch.filtered_enter(enter, lambda *a: None, ("own#",), failures.append, loop)
        __exit__ = _native.torch.guarded_exit(exit_, lambda *a: None, Local, failures.append, loop)

    run = stepscope.start(name="ranges")
    st = State.s
    st.iter_started = _native.now()  # a pass began before the first fetch: its time is the fetch's
    with Wrapped("fetch#1"):
        assert st.depth == 1 and st.iter_started is None and st.fetch_t0 > 0
        with Wrapped("fetch#inner"):  # a loader read inside a fetch is part of it
            assert st.depth == 2
        with Wrapped("user range inside"):
            pass
    assert st.depth == 0 and _Reports.calls == [("fetched", True, None)]
    with Wrapped("zero#SGD"):
        pass
    with pytest.raises(StopIteration):
        with Wrapped("fetch#2"):
            raise StopIteration
    with pytest.raises(KeyError):  # a failed fetch is no fetch; the error reaches the caller
        with Wrapped("fetch#3"):
            raise KeyError("from the loader")
    run.stop()
    assert _Reports.calls == [("fetched", True, None), ("optimizer_used",), ("exhausted", True)]
    assert st.depth == 0 and not failures
    r = stepscope.load(run.path)
    spans = r.events[(r.events["category"] == "framework") & (r.events["name"] == "Optimizer.zero_grad")]
    assert len(spans) == 1 and spans["duration_ns"].iloc[0] >= 0


def test_timed_backward_counts_nested_calls_once_and_passes_errors_through():
    failures, _Reports.calls = [], []

    class State:
        s = _native.torch.LoopState(_Reports())

    class Compiler:
        _is_compiling_flag = False

    def engine(x, nested=False):
        if nested:
            return backward(x)
        if x == "boom":
            raise ValueError("from the engine")
        return x * 2

    backward = _native.torch.timed_backward(engine, State, Compiler, failures.append)
    assert backward(3) == 6
    assert _Reports.calls == [("backward_started", True), ("backward_ended", True)]
    _Reports.calls = []
    assert backward(4, nested=True) == 8  # a backward inside a backward counts once
    assert _Reports.calls == [("backward_started", True), ("backward_ended", True)]
    _Reports.calls = []
    State.s.in_optimizer = 1  # LBFGS: a backward inside the optimizer step begins no step
    with pytest.raises(ValueError, match="from the engine"):
        backward("boom")
    assert _Reports.calls == [("backward_started", False), ("backward_ended", True)]
    assert State.s.in_backward == 0
    _Reports.calls, State.s.in_optimizer, State.s.depth = [], 0, 1  # inside a forward: no step begins
    backward(1)
    assert _Reports.calls == [("backward_ended", True)]
    _Reports.calls, Compiler._is_compiling_flag = [], True  # torch.export traces: nothing timed
    assert backward(5) == 10 and _Reports.calls == [] and not failures


def test_a_fetch_left_to_its_work_asks_the_guess_only_when_no_work_shows():
    asked = []
    tracker = StepTracker()
    tracker.guess = lambda: asked.append(1) or "eval"
    tracker.fetched(10, 20, None)
    tracker.forward_started("train", 30)  # the work shows the mode
    assert tracker.mode == "train" and not asked
    tracker.forward_ended("train", 30, 40)
    tracker.optimizer_used()
    tracker.backward_started(50)
    tracker.backward_ended(50, 60)
    tracker.optimizer_started(1, 60)
    tracker.optimizer_ended(1, 60, 70)
    tracker.fetched(80, 90, None)
    tracker.fetched(90, 100, None)  # no work on the first: its own step, of the guessed mode
    assert tracker.mode == "eval" and asked
    del tracker.guess  # no guess (deleted, or None): train, so with an optimizer known,
    tracker.fetched(110, 120, None)  # batches read ahead of their work, all this step's GetNext
    assert tracker.pending == (90, 100, None) and tracker.pending_more == [(110, 120)] and len(asked) == 2


class _Phases(StepTracker):
    __slots__ = ()
    calls = []

    def forward_started(self, mode, now):
        self.calls.append(("forward_started", mode, now > 0))

    def forward_ended(self, mode, t0, t1, phase):
        self.calls.append(("forward_ended", mode, t1 >= t0 > 0, phase))

    def loss(self, t0, t1):
        self.calls.append(("loss", t1 >= t0 > 0))


class _Module:  # what timed_root needs of a module: a weak reference and `training`
    training = True


def test_timed_root_reports_forwards_and_losses_and_passes_calls_through():
    failures, seen, depths, _Phases.calls = [], [], [], []
    forward, recompute = 11, 12

    class State:
        s = _native.torch.LoopState(_Phases())

    class Compiler:
        _is_compiling_flag = False

    class Roots:
        stop_at_known = None

        def known_root_ran(self, loop):
            seen.append(loop)
            self.stop_at_known = None

    grad = [True]
    module, roots = _Module(), Roots()

    def call_impl(m, *args, **kwargs):
        assert m is module
        depths.append(State.s.depth)
        if kwargs.get("nested"):
            return model(1)  # a root inside a root: passed through, not timed
        if kwargs.get("boom"):
            raise ValueError("from the forward")
        return args, kwargs

    def make(loss, inner=None):
        return _native.torch.timed_root(weakref.ref(module), inner, call_impl, State, roots, lambda: grad[0],
                                  lambda m: False, Compiler, failures.append, loss, (forward, recompute))

    model, loss = make(False), make(True)
    assert model(1, 2, k=3) == ((1, 2), {"k": 3}) and depths == [1] and State.s.depth == 0
    assert _Phases.calls == [("forward_started", "train", True), ("forward_ended", "train", True, forward)]
    _Phases.calls, grad[0] = [], False  # no grad: eval
    model(nested=True)
    assert _Phases.calls == [("forward_started", "eval", True), ("forward_ended", "eval", True, forward)]
    _Phases.calls, grad[0] = [], True
    State.s.forced_modes.append("predict")  # a framework loop's mode wins
    roots.stop_at_known = State.s  # a known root ran in the loop that looked again
    model()
    assert _Phases.calls[0] == ("forward_started", "predict", True) and seen == [State.s]
    State.s.forced_modes.clear()
    _Phases.calls = []
    assert loss(4) == ((4,), {})
    assert _Phases.calls == [("loss", True)]
    _Phases.calls, State.s.in_backward = [], 1  # inside a backward: recomputed forwards
    model()
    loss()
    assert _Phases.calls == [("forward_ended", "train", True, recompute)] * 2
    _Phases.calls, State.s.in_backward = [], 0
    with pytest.raises(ValueError, match="from the forward"):  # what the call raises reaches the caller
        model(boom=True)
    assert _Phases.calls[-1][0] == "forward_ended" and State.s.depth == 0
    _Phases.calls, Compiler._is_compiling_flag = [], True  # torch.export traces: nothing timed
    assert model(5) == ((5,), {}) and _Phases.calls == []
    Compiler._is_compiling_flag = False
    inner = make(False, inner=lambda *a, **k: ("inner", a, k))  # the slot held a compiled call before us
    assert inner(6, x=7) == ("inner", (6,), {"x": 7}) and len(_Phases.calls) == 2
    many = tuple(range(20))  # more arguments than the call's stack buffer
    assert model(*many, **{f"k{i}": i for i in range(5)})[0] == many
    assert not failures


def test_native_wrappers_need_a_native_loop_state_and_still_call_through():
    failures = []

    class State:
        s = object()  # not a LoopState

    backward = _native.torch.timed_backward(lambda x: x + 1, State, type("C", (), {"_is_compiling_flag": False}),
                                      failures.append)
    assert backward(1) == 2
    assert len(failures) == 1 and "LoopState" in str(failures[0])
    st = _native.torch.LoopState(StepTracker())
    assert (st.depth, st.in_backward, st.in_optimizer, st.stack, st.forced_modes, st.iter_started) == \
        (0, 0, 0, [], [], None)
    assert st.fetch_t0 == st.zero_grad_t0 == 0
    with pytest.raises(AttributeError):
        st.fetch_t0 = 1  # the native wrappers' own


def test_optimizer_hooks_bookkeeping_counts_nested_steps_once():
    calls = []

    class Tracker(StepTracker):
        __slots__ = ()

        def optimizer_started(self, key, now):
            calls.append(("started", key, now > 0))

        def optimizer_ended(self, key, t0, t1):
            calls.append(("ended", key, t1 >= t0 > 0))

    class State:
        s = _native.torch.LoopState(Tracker())

    _native.torch.optimizer_began(State, 7)
    _native.torch.optimizer_began(State, 8)  # an optimizer stepping another (a wrapper's inner step)
    assert State.s.in_optimizer == 2
    _native.torch.optimizer_done(State, 8)
    _native.torch.optimizer_done(State, 7)
    assert calls == [("started", 7, True), ("ended", 7, True)] and State.s.in_optimizer == 0
    with pytest.raises(TypeError, match="LoopState"):
        _native.torch.optimizer_began(type("Bad", (), {"s": object()}), 1)


def test_reports_go_native_until_the_class_replaces_one():
    """The hooks call a StepTracker's reports natively (csrc/torch/tell.cc); a report replaced
    on the class afterwards (a patch, a test's injected failure) is called from then on."""

    class Plain(StepTracker):
        __slots__ = ()

    class State:
        s = _native.torch.LoopState(Plain())

    tracker = State.s.tracker
    _native.torch.optimizer_began(State, 7)
    _native.torch.optimizer_done(State, 7)
    assert 7 in tracker.optimizers_known and 7 in tracker.optimizers_in_step
    calls = []
    Plain.optimizer_ended = lambda self, key, t0, t1: calls.append((key, t1 >= t0 > 0))
    _native.torch.optimizer_began(State, 8)
    _native.torch.optimizer_done(State, 8)
    assert calls == [(8, True)] and 8 in tracker.optimizers_known and 8 not in tracker.optimizers_in_step
    del Plain.optimizer_ended
    _native.torch.optimizer_began(State, 9)
    _native.torch.optimizer_done(State, 9)
    assert calls == [(8, True)] and 9 in tracker.optimizers_in_step


def _optimizer_state(calls):
    """A thread's loop state (as ``local.s``) whose tracker records its optimizer reports
    in calls: ("started", key) and ("ended", key, t1 >= t0 > 0)."""

    class Tracker(StepTracker):
        __slots__ = ()

        def optimizer_started(self, key, now):
            calls.append(("started", key))

        def optimizer_ended(self, key, t0, t1):
            calls.append(("ended", key, t1 >= t0 > 0))

    class State:
        s = _native.torch.LoopState(Tracker())

    return State


def test_native_optimizer_hooks_time_the_outermost_step_and_never_raise():
    """csrc/torch/optimizer_hooks.cc: the global optimizer hooks of eager jobs. The one optimizer
    asked for (or every one), nothing while torch.export traces, a failure handed to fail()."""
    calls, failures = [], []

    State = _optimizer_state(calls)

    class Compiler:
        _is_compiling_flag = False

    first, second = object(), object()
    pre, post = (_native.torch.optimizer_hook(State, Compiler, None, failures.append, p) for p in (False, True))
    assert pre(first, (), {}) is None and pre(second, (), {}) is None  # an optimizer stepping another
    post(second, (), {})
    post(first, (), {})
    assert calls == [("started", id(first)), ("ended", id(first), True)] and State.s.in_optimizer == 0
    only_pre, only_post = (_native.torch.optimizer_hook(State, Compiler, id(second), failures.append, p)
                           for p in (False, True))
    calls.clear()
    for optimizer in (first, second):
        only_pre(optimizer, (), {})
        only_post(optimizer, (), {})
    assert calls == [("started", id(second)), ("ended", id(second), True)]
    calls.clear()
    Compiler._is_compiling_flag = True  # torch.export traces: nothing
    pre(first, (), {})
    post(first, (), {})
    assert calls == [] and State.s.in_optimizer == 0
    Compiler._is_compiling_flag = False

    class Broken:
        pass  # no loop state: optimizer_began fails

    broken = _native.torch.optimizer_hook(Broken, Compiler, None, failures.append, False)
    assert broken(first, (), {}) is None and len(failures) == 1 and isinstance(failures[0], AttributeError)
    assert not failures[1:]


def test_optimizer_steps_end_at_their_range_and_a_step_outside_one_asks_for_the_post_hook():
    """torch runs an optimizer step's hooks inside its `Optimizer.step#` range: the native
    pre-hook begins the step, the range's exit ends it (nested steps once, a step that
    raises too), and no post-hook is registered. A step outside such a range makes the
    pre-hook ask, once, for the post-hook; a post-hook that runs inside a range passes."""
    enter, exit_ = vars(_Range)["__enter__"], vars(_Range)["__exit__"]
    calls, failures, asked = [], [], []

    State = _optimizer_state(calls)

    class Local:
        stack = []

    class Compiler:
        _is_compiling_flag = False

    loop = (State, ("fetch#",), ("zero#",), 0, _native.intern("z"), ("Optimizer.step#",))

    class Wrapped(_Range):
        __enter__ = _native.torch.filtered_enter(enter, lambda *a: None, ("Optimizer.",), failures.append, loop)
        __exit__ = _native.torch.guarded_exit(exit_, lambda *a: None, Local, failures.append, loop)

    pre = _native.torch.optimizer_hook(State, Compiler, None, failures.append, False, lambda: asked.append(1))
    post = _native.torch.optimizer_hook(State, Compiler, None, failures.append, True)
    outer, inner = object(), object()
    st = State.s
    with Wrapped("Optimizer.step#Lookahead.step"):
        pre(outer, (), {})
        with Wrapped("Optimizer.step#SGD.step"):  # the wrapper steps its inner optimizer
            pre(inner, (), {})
            post(inner, (), {})  # a post-hook inside its range passes (the Python pair's)
        assert st.in_optimizer == 1 and st.optimizer_ranges == 1
    assert calls == [("started", id(outer)), ("ended", id(outer), True)]
    assert st.in_optimizer == 0 and st.optimizer_ranges == 0 and not asked
    calls.clear()
    with pytest.raises(FloatingPointError):  # the step raises: its range still exits
        with Wrapped("Optimizer.step#SGD.step"):
            pre(inner, (), {})
            raise FloatingPointError("overflow")
    assert calls == [("started", id(inner)), ("ended", id(inner), True)] and st.in_optimizer == 0
    calls.clear()
    pre(outer, (), {})  # no range around it: only a post-hook can end it
    assert asked == [1] and st.in_optimizer == 1
    post(outer, (), {})
    pre(outer, (), {})
    post(outer, (), {})
    assert asked == [1]  # asked once
    assert calls == [("started", id(outer)), ("ended", id(outer), True)] * 2 and st.in_optimizer == 0
    assert not failures


def test_the_operator_window_schedule_is_read_again_when_the_class_changes_it(run_dir):
    """StepTracker.ops_due (integrations/torch/_ops.py sets it on the class) is kept by the
    native tracker between step begins while the class is unchanged; assigning it, on the
    class or a base, is seen at the next step begin."""
    due_calls = []

    class Tracker(StepTracker):
        __slots__ = ()
        ops_due = 3

        @staticmethod
        def ops_step(tracker, step, at):  # as _ops.py sets it: called with the tracker
            due_calls.append(step)

    run = stepscope.start(name="ops_due")
    tracker = Tracker()
    t = _native.now()

    def one_step():
        nonlocal t
        tracker.fetched(t, t + 10, "train")
        tracker.forward_started("train", t + 20)
        tracker.forward_ended("train", t + 20, t + 30)
        tracker.backward_started(t + 40)
        tracker.backward_ended(t + 40, t + 50)
        t += 100

    for _ in range(5):
        one_step()
    assert due_calls == [3, 4]  # steps 0..4 began; due from step 3
    Tracker.ops_due = 1 << 62  # the schedule moved on: no more calls
    for _ in range(3):
        one_step()
    assert due_calls == [3, 4]
    StepTracker.ops_due, saved = 6, StepTracker.ops_due  # on the base: the subclass's own still wins
    try:
        one_step()
        assert due_calls == [3, 4]
        del Tracker.ops_due  # now the base's
        one_step()
        assert due_calls == [3, 4, 9]
    finally:
        StepTracker.ops_due = saved
    tracker.close()
    run.stop()


def test_span_counted_records_a_span_to_now_and_its_value_at_the_start(run_dir):
    """One native call for a collective's call and its bytes (issue 57): the span ends at the
    time it returns, the counter sits at the span's start with the same name and arg; bad
    arguments raise, and with no session it records nothing and still returns the time."""
    from stepscope.core import recording

    t = recording.now()
    assert recording.span_counted(recording.COMM, recording.intern("x"), t, 1, 8) >= t  # no session: a time
    s = stepscope.start(name="counted")
    name = recording.intern("all_reduce@0")
    t0 = recording.now()
    t1 = recording.span_counted(recording.COMM, name, t0, 7, 4096)
    after = recording.now()
    for bad in [(), (recording.COMM, name, t0, 7), (recording.COMM, name, -1, 7, 1),
                (recording.COMM, name, t0, "x", 1), (recording.COMM, name, t0, 7, "many")]:
        with pytest.raises((TypeError, OverflowError, ValueError)):
            recording.span_counted(*bad)
    s.stop()
    assert t0 <= t1 <= after
    ev = stepscope.load(s.path, quiet=True).select(categories=["comm"])
    span = ev[ev["kind"] == "span"]
    value = ev[ev["kind"] == "counter"]
    assert len(span) == len(value) == 1
    assert span["name"].iloc[0] == value["name"].iloc[0] == "all_reduce@0"
    assert span["arg"].iloc[0] == value["arg"].iloc[0] == 7 and value["value"].iloc[0] == 4096
    assert value["start_ns"].iloc[0] == span["start_ns"].iloc[0] and span["duration_ns"].iloc[0] >= 0
