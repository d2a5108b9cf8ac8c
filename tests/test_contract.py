"""The integration contract (docs/design.md, "Integrations"): idempotent
instrument()/uninstrument() that leave frameworks exactly as found, a registry
instead of imports, public seams instead of private state, and nothing left on
user objects that pickle, deepcopy, torch.save or TorchScript can see."""

import copy
import os
import pickle
import sys
import warnings

import pytest

from conftest import REPO, run_python

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope.integrations import torch as st_torch  # noqa: E402

# --- architecture: tests/test_architecture.py (no torch needed) ------------------------------
def test_registered_instrumentors_load_without_their_frameworks():
    r = run_python("""
        import sys
        from stepscope.core import plugins
        eps = {ep.name: ep.load() for ep in plugins.entry_points(plugins.INSTRUMENTORS)}
        print(sorted(eps))
        print(all(callable(getattr(i, "on_import", None)) for i in eps.values()))
        print([m for m in ("torch", "tensorflow", "keras", "lightning") if m in sys.modules])
    """, cwd="/")
    assert r.returncode == 0, r.stderr
    names, has_on_import, heavy = r.stdout.split("\n")[:3]
    assert {"torch", "lightning", "pytorch_lightning", "tensorflow", "keras"} <= set(eval(names))
    assert has_on_import == "True" and heavy == "[]"


# --- instrument / uninstrument --------------------------------------------------------------
def _snapshot():
    """Every attribute of what the torch integration may patch, by identity."""
    from torch.optim import optimizer as optim_mod
    from torch.utils.data import dataloader

    owners = [dataloader._BaseDataLoaderIter, dataloader.DataLoader, torch.autograd, optim_mod.Optimizer,
              torch.nn.functional, torch.nn.Module, torch, torch.autograd.profiler.profile,
              torch.autograd.profiler.record_function]
    snap = {(repr(o), k): id(v) for o in owners for k, v in vars(o).items()}
    hooks = torch.nn.modules.module
    snap["hooks"] = (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks),
                     len(optim_mod._global_optimizer_pre_hooks), len(optim_mod._global_optimizer_post_hooks))
    return snap


def test_second_instrument_warns_and_uninstrument_restores_every_attribute(run_dir):
    import torch._dynamo  # its import rebinds torch.manual_seed: not ours to compare
    st_torch.uninstrument()
    before = _snapshot()
    assert st_torch.instrument()
    with pytest.warns(RuntimeWarning, match="already instrumented") as caught:
        assert st_torch.instrument()
    assert caught[0].filename == __file__  # the warning points at the caller
    assert _snapshot() != before
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    st_torch.uninstrument()
    st_torch.uninstrument()  # a second call does nothing
    after = _snapshot()
    assert {k: after.get(k) for k in before} == before
    assert not [k for k in set(after) - set(before) if not str(k[1]).startswith("_")], set(after) - set(before)
    assert "_compiled_call_impl" not in model.__dict__


# --- nothing on user objects ------------------------------------------------------------------
sys.path.insert(0, os.path.join(REPO, "tests", "scripts"))
from nets import Net  # noqa: E402 - importable where stepscope is absent


def _train(model, loss_fn, steps=4):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model(torch.randn(4, 8)), torch.randint(0, 2, (4,))).backward()
        opt.step()


def test_instrumented_model_pickles_copies_saves_and_scripts(run_dir, tmp_path):
    st_torch.instrumentor.ensure()
    session = stepscope.start(name="objects")
    model, loss_fn = Net(), torch.nn.CrossEntropyLoss()
    _train(model, loss_fn)
    ema = copy.deepcopy(model)
    pickle.loads(pickle.dumps(model))
    pickle.dumps(loss_fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        scripted = torch.jit.script(model)
        torch.jit.script(loss_fn)
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(scripted(x), model(x)) and torch.equal(ema(x), model(x))
        torch.jit.trace(model, x)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    session.stop()
    assert b"stepscope" not in path.read_bytes()
    steps = stepscope.load(session.path).steps
    assert (steps["mode"] == "train").sum() == 4
    # loads where stepscope is not installed: no stepscope module may be importable there
    r = run_python(f"""
        import sys
        class NoStepscope:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "stepscope":
                    raise ImportError("stepscope is not installed here")
        sys.meta_path.insert(0, NoStepscope())
        sys.path.insert(0, {os.path.join(REPO, "tests", "scripts")!r})
        import torch
        m = torch.load({str(path)!r}, weights_only=False)
        print("LOADED", type(m).__name__, m(torch.randn(2, 8)).shape[-1])
    """, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "LOADED Net 2" in r.stdout


def test_data_parallel_replicas_call_themselves_not_the_timed_original(run_dir):
    """nn.DataParallel replicates a module by copying its __dict__: a root's slot
    must not come along (it would run the original module on every device)."""
    st_torch.instrumentor.ensure()
    session = stepscope.start(name="replicas")

    class Who(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            return self

    model = Who()
    model.train()  # a model not timed yet: discovery looks for it
    with torch.no_grad():
        model(torch.randn(2))  # adopted as a root
    assert "_compiled_call_impl" in model.__dict__
    replica = model._replicate_for_data_parallel()
    assert "_compiled_call_impl" not in replica.__dict__
    with torch.no_grad():
        assert replica(torch.randn(2)) is replica and model(torch.randn(2)) is model
    session.stop()


def test_deepcopy_in_every_step_records_the_true_steps(run_dir):
    """An EMA copy made each step is not a model of the loop."""
    st_torch.instrumentor.ensure()
    session = stepscope.start(name="ema")
    model, loss_fn = Net(), torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ema = copy.deepcopy(model)
    for _ in range(6):
        opt.zero_grad()
        loss_fn(model(torch.randn(4, 8)), torch.randint(0, 2, (4,))).backward()
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)
        copy.deepcopy(model)
    session.stop()
    steps = stepscope.load(session.path).steps
    assert list(steps["mode"]) == ["train"] * 6
    assert (steps["Forward"] > 0).all() and (steps["Backward"] > 0).all()


def test_seams_forced_mode_and_hidden(run_dir):
    st_torch.instrumentor.ensure()
    session = stepscope.start(name="seams")
    model = Net()
    with st_torch.hidden():
        model(torch.randn(2, 8))  # a symbolic build: no step
    with st_torch.forced_mode("predict"):
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(2, 8))
    session.stop()
    steps = stepscope.load(session.path).steps
    assert list(steps["mode"]) == ["predict"] * 3
    assert st_torch.step_tracker() is st_torch.instrumentor.tracker


# --- warnings keep the user's location ----------------------------------------------------
def _warning_sites():
    """Warnings torch raises about the caller's own code, from a real training step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.nn.functional.mse_loss(model(x), y)  # size mismatch: (8, 1) against (8,)
        (g,) = torch.autograd.grad(loss, model.weight, retain_graph=True, only_inputs=False)
        torch.autograd.backward([loss], grad_variables=[torch.ones(())])
        opt.step()
    return [(w.category.__name__, os.path.basename(w.filename), w.lineno) for w in caught]


def test_torch_warnings_name_the_users_line_not_stepscope(run_dir):
    plain = _warning_sites()
    assert {c for c, _, _ in plain} >= {"UserWarning", "FutureWarning"} and len(plain) >= 3, plain
    st_torch.instrument()
    try:
        with stepscope.profile(dir=str(run_dir)):
            profiled = _warning_sites()
    finally:
        st_torch.uninstrument()
    assert profiled == plain
    assert all(f == os.path.basename(__file__) for _, f, _ in profiled), profiled
