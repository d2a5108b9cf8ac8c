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
