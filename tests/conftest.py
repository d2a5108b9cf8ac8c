"""Shared helpers: real subprocesses for everything that must survive crashes,
forks and failing disks."""

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers share the cores: one OpenMP thread each, or torch's idle intra-op threads
    # spin on cores another worker needs (the jobs the tests start inherit it).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def run_python(code, cwd, env=None, timeout=120, **kwargs):
    """Runs `code` in a fresh interpreter (cwd outside the checkout, so the
    installed stepscope is the one imported)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def stepscope_frames(text):
    """The traceback frames in ``text`` that run stepscope's own code: a file inside the
    imported stepscope package. Not the word "stepscope": the checkout's folder, and with
    it the tox environment's site-packages, is often named after the project."""
    import re

    import stepscope

    package = os.path.dirname(os.path.realpath(stepscope.__file__)) + os.sep
    return [path for path in re.findall(r'^\s*File "([^"]+)", line \d+', text, re.MULTILINE)
            if os.path.realpath(path).startswith(package)]


def finding_where_judged(summary, rule):
    """``rule``'s finding in ``summary``; or, where the rule declined to judge because other
    processes kept the host busy (its reason names the busy cores: the rule working as it
    should on a shared machine), a skip that quotes the reason. Any other absence fails:
    the tests of a rule that judges only an uncontended host hold on any machine."""
    found = [f for f in summary["findings"] if f["rule"] == rule]
    if found:
        return found[0]
    reason = summary["rules_not_applicable"].get(rule, "")
    if "busy" in reason and "other processes" in reason:
        pytest.skip(f"{rule} declined on a shared host: {reason}")
    raise AssertionError(f"no {rule} finding; findings {[f['rule'] for f in summary['findings']]}, "
                         f"its reason: {reason or 'none given'}")


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


GPU_RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gpu", "h200-torch2.11-runs.tgz")


@pytest.fixture(scope="module")
def gpu_fixture_runs(tmp_path_factory):
    """The runs recorded on a real GPU (tests/test_gpu_fixtures.py says how), unpacked."""
    import tarfile

    root = tmp_path_factory.mktemp("gpu-runs")
    with tarfile.open(GPU_RUNS) as tar:
        tar.extractall(root, filter="data") if sys.version_info >= (3, 12) else tar.extractall(root)
    return root


@pytest.fixture(autouse=True)
def _no_leftover_session():
    yield
    import stepscope

    stepscope.stop()
    os.environ.pop("STEPSCOPE_ACTIVE_RUN", None)
    os.environ.pop("STEPSCOPE_ACTIVE_OWNER", None)
    os.environ.pop("STEPSCOPE_RUN", None)


# --- parallel runs (pytest-xdist: tox runs tests/run_suite.py, `-n auto --dist loadgroup`) ------

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """One worker per CPU, at most four, and one per 6 GiB of memory: a worker holds
    torch, TensorFlow and the subprocesses it starts (1-3 GiB)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gib = 6
    return max(1, min(cpus, 4, int(memory_gib // 6)))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """A test that uses a module- or session-scoped fixture of the suite's runs in its
    module's worker (the fixture, often a whole training run, is made once); the other
    tests are spread one by one. A test that names its own group keeps it."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info else ()
        if any(d.scope in ("module", "session", "package") and d.baseid for ds in defs for d in ds):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_runtest_logreport(report):
    """run_suite.py's parallel part lists the tests that failed (in the controller: the
    workers' reports come there), without xdist's ``@group`` suffix, to run them again."""
    path = os.environ.get("RUN_SUITE_FAILED")
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        nodeid, at, group = report.nodeid.rpartition("@")
        with open(path, "a") as f:
            f.write((nodeid if at and "]" not in group and "::" not in group else report.nodeid) + "\n")


def pytest_sessionfinish(session, exitstatus):
    """run_suite.py's last part (`-m alone`) finds none in a selection without them: a pass."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and session.config.option.markexpr == "alone":
        session.exitstatus = pytest.ExitCode.OK
