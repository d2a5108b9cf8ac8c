"""Shared helpers: real subprocesses for everything that must survive crashes,
forks and failing disks."""

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, cwd, env=None, timeout=120, **kwargs):
    """Runs `code` in a fresh interpreter (cwd outside the checkout, so the
    installed stepscope is the one imported)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture
def run_dir(tmp_path):
    """A folder for runs, and STEPSCOPE_DIR pointing at it for in-process sessions."""
    d = tmp_path / "runs"
    old = os.environ.get("STEPSCOPE_DIR")
    os.environ["STEPSCOPE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("STEPSCOPE_DIR", None)
    else:
        os.environ["STEPSCOPE_DIR"] = old


@pytest.fixture(autouse=True)
def _no_leftover_session():
    yield
    import stepscope

    stepscope.stop()
    os.environ.pop("STEPSCOPE_ACTIVE_RUN", None)
    os.environ.pop("STEPSCOPE_RUN", None)
