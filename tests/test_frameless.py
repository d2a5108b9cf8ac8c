"""_native.around (csrc/common/around.cc): wrappers of user-facing calls that leave no frame in a
traceback (issue 47), pass results and errors through unchanged and never raise their own."""

import traceback

import pytest

from stepscope.core import _native


def _boom(x):
    raise ValueError(f"bad {x}")


def _frames(exc):
    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


def test_a_wrapped_call_raises_with_the_traceback_of_the_original():
    seen = []
    wrapped = _native.around(_boom, lambda *a, **k: (a, k, "token"), lambda t, e: seen.append((t, e)), seen.append)
    with pytest.raises(ValueError, match="bad 3") as info:
        wrapped(3)
    assert _frames(info.value) == ["test_a_wrapped_call_raises_with_the_traceback_of_the_original", "_boom"]
    assert seen == [("token", info.value)]  # after() saw what the original raised


def test_before_may_change_the_arguments_and_after_sees_success():
    seen = []
    wrapped = _native.around(lambda a, b=0: a + b, lambda a, **k: ((a * 10,), {"b": 1}, a),
                             lambda t, e: seen.append((t, e)), seen.append)
    assert wrapped(2) == 21 and seen == [(2, None)]
    plain = _native.around(lambda a: a, lambda *a, **k: None, lambda t, e: seen.append("after"), seen.append)
    assert plain(5) == 5 and seen == [(2, None)]  # None: called as is, nothing after


def test_failures_of_before_and_after_go_to_fail_never_to_the_caller():
    failures = []

    def bad_before(*a, **k):
        raise RuntimeError("before")

    def bad_after(t, e):
        raise RuntimeError("after")

    assert _native.around(lambda a: a + 1, bad_before, bad_after, failures.append)(1) == 2
    assert _native.around(lambda a: a + 1, lambda *a, **k: (a, None, 0), bad_after, failures.append)(1) == 2
    assert _native.around(lambda a: a + 1, lambda *a, **k: "not a tuple", bad_after, failures.append)(1) == 2
    assert [str(f) for f in failures][:2] == ["before", "after"] and isinstance(failures[2], TypeError)
    with pytest.raises(ValueError):  # the original's error still wins over after's
        _native.around(_boom, lambda *a, **k: (a, None, 0), bad_after, failures.append)(1)


def test_bound_on_a_class_and_the_original_from_the_class():
    class C:
        def method(self, x):
            """doc"""
            return (self, x)

    original = C.method
    C.method = _native.around(original, lambda *a, **k: (a, k, None), lambda t, e: None, print)
    c = C()
    assert c.method(1) == (c, 1)
    assert C.method is original  # read from the class: the original (introspection, TorchScript)
    wrapper = C.__dict__["method"]
    assert wrapper.__stepscope_original__ is original and wrapper.__wrapped__ is original
    assert wrapper.__name__ == "method" and wrapper.__doc__ == "doc"  # the original's attributes


def test_wrong_arguments_raise():
    with pytest.raises(TypeError):
        _native.around(len, len, len)
    with pytest.raises(TypeError):
        _native.around(len, len, len, "not callable")


def test_init_process_group_that_raises_prints_torch_s_traceback_byte_for_byte(tmp_path):
    """Issue 57 item 7: torch.distributed.init_process_group raising (here an unknown backend)
    under STEPSCOPE=1 prints the plain run's stderr exactly: no frame of stepscope's wrapper."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    from conftest import stepscope_frames

    script = tmp_path / "join.py"
    script.write_text("import torch.distributed as dist\n"
                      "dist.init_process_group('no-such-backend', init_method='tcp://127.0.0.1:29759', rank=0, "
                      "world_size=1)\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    runs = [subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env={**base, **extra})
            for extra in ({}, {"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs")})]
    plain, profiled = runs
    assert plain.returncode == profiled.returncode != 0 and "Traceback" in plain.stderr, plain.stderr
    assert profiled.stderr == plain.stderr
    assert not stepscope_frames(profiled.stderr)


def test_with_result_after_sees_what_the_original_returned():
    seen = []
    wrapped = _native.around(lambda a: a * 2, lambda *a, **k: (a, k, "t"), lambda t, e, r: seen.append((t, e, r)),
                             seen.append, True)
    assert wrapped(4) == 8 and seen == [("t", None, 8)]
    with pytest.raises(ValueError):
        _native.around(_boom, lambda *a, **k: (a, k, "t"), lambda t, e, r: seen.append((t, e, r)), seen.append,
                       True)(1)
    assert seen[-1][0] == "t" and isinstance(seen[-1][1], ValueError) and seen[-1][2] is None


WAIT_TIMES_OUT = """
import datetime, os, sys, time, traceback
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    work = dist.irecv(torch.zeros(4), src=1)  # rank 1 never sends
    try:
        work.wait(timeout=datetime.timedelta(seconds=1))
    except RuntimeError:
        print("frames", [(os.path.basename(f.filename), f.name) for f in traceback.extract_tb(sys.exc_info()[2])])
        sys.stdout.flush()
else:
    time.sleep(4)
os._exit(0)
"""


@pytest.mark.slow
def test_a_point_to_point_wait_that_times_out_keeps_torch_s_traceback(tmp_path):
    """Issue 57 item 7: ProcessGroup.recv and Work.wait are wrapped frameless; a wait that
    raises (a peer that never sends) shows the frames it shows without stepscope."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    script = tmp_path / "wait.py"
    script.write_text(WAIT_TIMES_OUT)
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    frames = []
    for extra in ({}, {"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs")}):
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                              str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                             env={**base, **extra})
        assert out.returncode == 0, out.stderr[-3000:]
        frames.append([line for line in out.stdout.splitlines() if line.startswith("frames")])
        assert "stepscope:" not in out.stderr, out.stderr[-3000:]
    assert frames[0] == frames[1] and len(frames[0]) == 1, frames
    assert "stepscope" not in frames[1][0] and "wait.py" in frames[1][0]
