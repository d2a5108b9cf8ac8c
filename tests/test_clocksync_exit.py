"""A short distributed job exits cleanly under STEPSCOPE=1 (integrations/torch/_clocksync.py).

The clock exchange runs in a daemon thread that waits in the rendezvous store. A job
that ends while it still waits used to abort about one run in three ("terminate
called without an active exception": the thread returned from the store call while
the interpreter finalized, and its unwinding through pybind's frames called
std::terminate). Six short jobs (an abort one run in three shows in 91 suites of 100),
each a few collectives: every one exits 0 with its output, as without stepscope."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SHORT_JOB = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
if dist.get_rank() == 0:
    dist.send(t, 1)
else:
    dist.recv(t, 0)
dist.all_reduce(t)
os.write(1, f"sum {float(t.sum())}\\n".encode())  # (one write: the two ranks' lines stay whole)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_short_distributed_jobs_exit_cleanly(tmp_path):
    script = tmp_path / "short.py"
    script.write_text(SHORT_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"))
    for i in range(6):
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                              str(script)], cwd=tmp_path, env={**env, "STEPSCOPE_RUN": f"short{i}"},
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, (i, out.stderr[-3000:])
        assert "terminate called" not in out.stderr and out.stdout.count("sum 8.0") == 2, (i, out.stdout)
