"""What stepscope creates is never writable by others, whatever the umask (docs/design.md)."""

import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import run_python

TRAIN = """
    import os, torch, stepscope
    import stepscope.integrations.torch as st
    st.instrument()
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 2)),
                                       batch_size=8)
    with stepscope.profile(dir="runs", name="modes"):
        for x, y in data:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
"""


def _cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    return subprocess.run([sys.executable, "-m", "stepscope", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, umask=0)


def _modes(root):
    """path -> permission bits, for root and everything under it."""
    out = {str(root): stat.S_IMODE(os.lstat(root).st_mode)}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(folder, name)
            out[path] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


@pytest.mark.slow
def test_umask_000_grants_nobody_else_write(tmp_path):
    r = run_python(TRAIN, cwd=tmp_path, umask=0)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "runs" / "modes"
    for args in (["report", str(run)], ["export", str(run), "--format", "chrome", "-o", "chrome"],
                 ["export", str(run), "--format", "perfetto", "-o", "trace.pftrace"],
                 ["export", str(run), "--format", "parquet", "-o", "tables"]):
        r = _cli(*args, cwd=tmp_path)
        assert r.returncode == 0, (args, r.stderr)
    r = run_python("import stepscope; print(len(stepscope.load('runs/modes', dataset=True).steps))",
                   cwd=tmp_path, umask=0)  # the Parquet cache beside the run
    assert r.returncode == 0 and int(r.stdout) == 8, r.stderr

    modes = {**_modes(tmp_path / "runs"), **_modes(tmp_path / "chrome"), **_modes(tmp_path / "tables"),
             **_modes(tmp_path / "trace.pftrace")}
    writable = {p: oct(m) for p, m in modes.items() if m & 0o022}
    assert writable == {}
    process = _main_process(run)
    assert modes[str(tmp_path / "runs")] == 0o755
    assert modes[str(run)] == 0o755 and modes[str(run / process)] == 0o755
    for f in ("run.json", "report.html", f"{process}/process.json", f"{process}/trace.ssc"):
        assert modes[str(run / f)] == 0o644, f
    assert modes[str(tmp_path / "trace.pftrace")] == 0o644
    assert modes[str(tmp_path / "chrome" / "rank0.pt.trace.json")] == 0o644
    assert modes[str(tmp_path / "tables" / "steps.parquet")] == 0o644
    cached = [p for p in modes if "/.stepscope-cache/" in p]
    assert any(p.endswith(".parquet") for p in cached), sorted(modes)


def test_a_stricter_umask_is_honoured(tmp_path):
    r = run_python("import stepscope; stepscope.start(dir='runs', name='strict'); stepscope.stop()",
                   cwd=tmp_path, umask=0o077)
    assert r.returncode == 0, r.stderr
    modes = _modes(tmp_path / "runs" / "strict")
    assert set(modes.values()) <= {0o700, 0o600}, modes
    assert modes[str(tmp_path / "runs" / "strict" / "run.json")] == 0o600


def _main_process(run):
    for d in os.listdir(run):
        meta = run / d / "process.json"
        if meta.exists() and json.loads(meta.read_text()).get("origin") == "main":
            return d
    raise AssertionError(f"no main process folder in {run}")
