"""Whatever fails inside stepscope, the user's program ends as it would without it."""

import os
import textwrap

import pytest

from conftest import run_python

SCRIPT = """
    import sys, stepscope
    total = 0
    for i in range(200_000):
        with stepscope.annotate("work"):
            total += i * i
    print("total", total)
    sys.exit(3)
"""


def _baseline(tmp_path):
    r = run_python(SCRIPT, cwd=tmp_path)
    assert r.returncode == 3 and r.stderr == ""
    return r


def _assert_same_plus_one_warning(r, base):
    assert r.returncode == base.returncode
    assert r.stdout == base.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("stepscope: "), r.stderr
    assert "profiling is turned off" in lines[0]


def test_unwritable_output_folder(tmp_path):
    base = _baseline(tmp_path)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the run folder should go")
    r = run_python(SCRIPT, cwd=tmp_path, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(blocker / "runs")})
    _assert_same_plus_one_warning(r, base)


def test_run_folder_removed_by_the_program(tmp_path):
    """A run started in a temporary directory the program deletes before it exits: one
    line naming what happened at the finish, no traceback, the program's exit as is."""
    r = run_python("""
        import tempfile, time, stepscope
        with tempfile.TemporaryDirectory() as tmp:
            stepscope.start(dir=tmp, name="x")
            for i in range(5):
                stepscope.step()
                time.sleep(0.01)
        print("done")
    """, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "done\n"
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "was removed while the program ran" in lines[0], r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_read_only_output_folder_as_unprivileged_user(tmp_path):
    base = _baseline(tmp_path)
    work = tmp_path / "ro"
    work.mkdir()
    (work / "runs").mkdir()
    for p in (tmp_path, work):
        os.chmod(p, 0o755)
    os.chmod(work / "runs", 0o555)
    parents = str(tmp_path)
    while parents != "/":
        try:
            os.chmod(parents, os.stat(parents).st_mode | 0o005)
        except OSError:
            break
        parents = os.path.dirname(parents)
    env = {"STEPSCOPE": "1", "STEPSCOPE_DIR": str(work / "runs"), "HOME": str(work)}
    try:
        r = run_python(SCRIPT, cwd=work, env=env, user=65534)
    except PermissionError:
        pytest.skip("the interpreter is not executable by an unprivileged user here")
    if r.returncode != base.returncode and "stepscope:" not in r.stderr:
        pytest.skip(f"the interpreter does not run as an unprivileged user here: {r.stderr[-200:]}")
    _assert_same_plus_one_warning(r, base)


def test_disk_full_mid_run(tmp_path):
    """Writes start failing (EFBIG via RLIMIT_FSIZE, as on a full disk) mid-run."""
    base = _baseline(tmp_path)
    limited = textwrap.dedent("""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        import stepscope
        stepscope.start(flush_interval_ms=20)
    """) + textwrap.dedent(SCRIPT)
    r = run_python(limited, cwd=tmp_path, env={"STEPSCOPE_DIR": str(tmp_path / "runs")})
    _assert_same_plus_one_warning(r, base)
    assert "File too large" in r.stderr


@pytest.mark.parametrize("when", ["mid-run", "at start"])
def test_disk_full_for_every_file_is_one_line(tmp_path, when):
    """The disk fills (EFBIG for every file, as ENOSPC on a full disk): the trace's writer
    fails, and so does process.json at the end: one line for the one failure."""
    base = _baseline(tmp_path)
    limit = "resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))"
    limited = textwrap.dedent(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        import stepscope
        {limit if when == "at start" else ""}
        stepscope.start(flush_interval_ms=20)
        {limit if when == "mid-run" else ""}
    """) + textwrap.dedent(SCRIPT)
    r = run_python(limited, cwd=tmp_path, env={"STEPSCOPE_DIR": str(tmp_path / "runs")})
    _assert_same_plus_one_warning(r, base)
    assert "File too large" in r.stderr


def test_bad_setting_under_zero_edit_mode(tmp_path):
    base = _baseline(tmp_path)
    r = run_python(SCRIPT, cwd=tmp_path, env={"STEPSCOPE": "1", "STEPSCOPE_INTERVAL_MS": "fast",
                                              "STEPSCOPE_DIR": str(tmp_path / "runs")})
    _assert_same_plus_one_warning(r, base)
    assert "STEPSCOPE_INTERVAL_MS" in r.stderr and "10 to 60000" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_zero_edit_mode_records(tmp_path):
    r = run_python(SCRIPT, cwd=tmp_path, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs"),
                                              "STEPSCOPE_RUN": "zero"})
    assert r.returncode == 3 and r.stderr == "", r.stderr
    import stepscope

    ev = stepscope.load(tmp_path / "runs" / "zero").events
    assert (ev["name"] == "work").sum() == 200_000


def test_bad_keyword_is_a_clear_error():
    import stepscope

    with pytest.raises(ValueError, match="interval_ms=5 is out of range; allowed: 10 to 60000"):
        stepscope.start(interval_ms=5)
    with pytest.raises(ValueError, match="gpu='cuda' is not valid; allowed: auto, off, metrics, trace"):
        stepscope.profile(gpu="cuda")
    assert stepscope.current() is None


BAD_VALUES = [  # variable, value, what the line says
    ("STEPSCOPE_DIR", "runs-\udcff", "not UTF-8"),  # the byte 0xff: not a UTF-8 file name
    ("STEPSCOPE_RUN", "run-\udcfe\udcfe", "not UTF-8"),
    ("STEPSCOPE_RUN", "r" * 120_000, "longer than 255 bytes"),
    ("STEPSCOPE_DIR", "runs/" + "d" * 120_000, "longer than 4095 bytes"),
    ("STEPSCOPE_GPU", "g" * 120_000, "allowed: auto, off"),
    ("STEPSCOPE_STEPS", "\udcff" * 1000, "not UTF-8"),
    ("STEPSCOPE_INTERVAL_MS", "9" * 120_000, "allowed: 10 to 60000"),
]


@pytest.mark.parametrize("var,value,says", BAD_VALUES, ids=[f"{v[0]}-{i}" for i, v in enumerate(BAD_VALUES)])
def test_unusable_variable_is_one_short_line_naming_it(tmp_path, var, value, says):
    """A value no run folder can be made of: one short line that names the variable, and nothing on disk."""
    base = _baseline(tmp_path)
    env = {"STEPSCOPE": "1", "STEPSCOPE_DIR": "runs", var: value}
    before = set(os.listdir(tmp_path))
    r = run_python(SCRIPT, cwd=tmp_path, env=env)
    _assert_same_plus_one_warning(r, base)
    line = r.stderr.strip()
    assert f"{var}=" in line and says in line, line
    assert len(line) < 400, len(line)
    assert set(os.listdir(tmp_path)) == before  # no runs folder, no run, no process folder
