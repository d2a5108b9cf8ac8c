"""The native module is a guest in someone else's process.

It exports exactly one dynamic symbol, ``PyInit__native``, however it was
built: a toolchain that links libstdc++/libgcc statically must not let
stepscope's copy interpose on the one torch or TensorFlow uses (seen on a GPU
image: `import torch` crashed; here a static build makes `torch.jit.script`
hang). And when the module cannot be loaded at all, a ``STEPSCOPE=1`` job runs
unprofiled with one line saying why.
"""

import glob
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
from elftools.elf.elffile import ELFFile

from conftest import REPO, run_python

ENTRY_POINT = "PyInit__native"


def exported_symbols(path):
    """Names the shared object defines in its dynamic symbol table (what
    other libraries in the process can bind to)."""
    with open(path, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        assert dynsym is not None, f"{path} has no dynamic symbol table"
        return sorted(sym.name for sym in dynsym.iter_symbols()
                      if sym.name and sym.entry.st_shndx != "SHN_UNDEF"
                      and sym.entry.st_info.bind in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE"))


def installed_native():
    r = run_python("import stepscope.core._native as n; print(n.__file__)", cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_installed_native_module_exports_only_its_entry_point():
    exports = exported_symbols(installed_native())
    assert exports == [ENTRY_POINT], f"{len(exports)} exported symbols, first: {exports[:10]}"


# --- a static libstdc++/libgcc build ------------------------------------------------

TORCH_PROBE = """
    import stepscope.core._native  # first, as STEPSCOPE=1 loads it
    import torch
    scripted = torch.jit.script(torch.nn.Linear(2, 2))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print("TORCH OK", scripted(torch.ones(1, 2)).shape[-1], float(loss) > 0)
"""

KERAS_PROBE = """
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import stepscope.core._native
    import numpy as np
    import tensorflow as tf
    import keras
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(np.random.rand(64, 8), np.random.rand(64, 1), epochs=2, batch_size=16, verbose=0)
    print("KERAS OK", len(history.history["loss"]), tf.reduce_sum(tf.ones(3)).numpy())
"""


def _build_wheel(out, env_extra):
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
           "-C", f"build-dir={out}/build", REPO]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = glob.glob(os.path.join(out, "stepscope-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _unpack(wheel, dest):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest)
    (so,) = glob.glob(os.path.join(dest, "stepscope", "core", "_native*.so"))
    return so


@pytest.fixture(scope="module")
def static_wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("static-wheel")
    return _build_wheel(out, {"LDFLAGS": "-static-libstdc++ -static-libgcc"})


def _probe(code, unpacked, timeout=300):
    env = {"PYTHONPATH": str(unpacked), "KERAS_BACKEND": "tensorflow"}
    try:
        return run_python(code, cwd=str(unpacked), env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("the probe hung with the static build's module loaded first (symbol interposition)")


@pytest.mark.slow
def test_static_toolchain_build_exports_only_its_entry_point_and_torch_works(static_wheel, tmp_path):
    so = _unpack(static_wheel, tmp_path)
    with open(so, "rb") as f:
        needed = [t.needed for t in ELFFile(f).get_section_by_name(".dynamic").iter_tags()
                  if t.entry.d_tag == "DT_NEEDED"]
    assert not any(n.startswith("libstdc++") for n in needed), f"not a static libstdc++ build: {needed}"
    assert exported_symbols(so) == [ENTRY_POINT]
    r = _probe(TORCH_PROBE, tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TORCH OK 2 True" in r.stdout


@pytest.mark.slow
def test_static_toolchain_build_leaves_tensorflow_and_keras_working(static_wheel, tmp_path):
    pytest.importorskip("keras")
    _unpack(static_wheel, tmp_path)
    r = _probe(KERAS_PROBE, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "KERAS OK 2 3.0" in r.stdout


@pytest.mark.slow
def test_manylinux_repair_is_accepted_and_keeps_one_export(static_wheel, tmp_path):
    """The documented local path to a wheel users install without a compiler."""
    pytest.importorskip("auditwheel", reason="the test extra installs auditwheel")
    auditwheel = [sys.executable, "-m", "auditwheel"]
    wheelhouse = tmp_path / "wheelhouse"
    r = subprocess.run(auditwheel + ["repair", "-w", str(wheelhouse), static_wheel],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (repaired,) = glob.glob(str(wheelhouse / "stepscope-*manylinux*.whl"))
    shown = subprocess.run(auditwheel + ["show", repaired], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "manylinux" in shown.stdout, shown.stdout + shown.stderr
    assert exported_symbols(_unpack(repaired, tmp_path / "unpacked")) == [ENTRY_POINT]


# --- a module that cannot be loaded ---------------------------------------------------

def _broken_copy(tmp_path, how):
    """The installed stepscope package, copied first on sys.path with its native
    module missing or unloadable."""
    r = run_python("import os, stepscope; print(os.path.dirname(stepscope.__file__))", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "site" / "stepscope"
    shutil.copytree(r.stdout.strip(), dest, ignore=shutil.ignore_patterns("__pycache__"))
    (so,) = glob.glob(str(dest / "core" / "_native*.so"))
    if how == "missing":
        os.remove(so)
    else:  # another architecture's or a truncated build: not a loadable ELF
        with open(so, "wb") as f:
            f.write(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    return tmp_path / "site"


@pytest.mark.parametrize("how", ["missing", "unloadable"])
def test_unloadable_native_module_leaves_the_job_unprofiled(tmp_path, how):
    site = _broken_copy(tmp_path, how)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        total = sum(i * i for i in range(1000))
        print("result", total)
        sys.exit(3)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                           cwd=str(tmp_path), timeout=60)
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), PYTHONPATH=str(site))
    profiled = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                              cwd=str(tmp_path), timeout=60)
    assert (profiled.returncode, profiled.stdout) == (plain.returncode, plain.stdout) == (3, "result 332833500\n")
    lines = profiled.stderr.strip().splitlines()
    assert len(lines) == 1, profiled.stderr
    assert "stepscope" in lines[0] and "native module" in lines[0] and "unprofiled" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


def test_unloadable_native_module_names_the_fix_on_import(tmp_path):
    site = _broken_copy(tmp_path, "unloadable")
    r = run_python("import stepscope", cwd=str(tmp_path), env={"PYTHONPATH": str(site)})
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "native module" in r.stderr and "reinstall" in r.stderr, r.stderr
