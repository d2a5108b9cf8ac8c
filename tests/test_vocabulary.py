"""One vocabulary: the native core, the recording side and the readers use the same names."""

import ast
import os
import subprocess
import sys

from conftest import REPO

from stepscope.core import _native
from stepscope.core import vocabulary as v


def test_native_module_declares_the_vocabularys_names():
    assert _native.PHASES == v.PHASE_NAMES
    assert _native.CATEGORIES == v.CATEGORIES
    assert _native.GPU_TYPES == v.GPU_TYPES
    assert v.PHASE_NAMES[:len(v.PHASES)] == v.PHASES and v.PHASE_NAMES[-1] == v.RECOMPUTE
    assert set(v.COMPUTE_PHASES) == set(v.PHASES) - {v.GETNEXT}
    assert len(v.CATEGORIES) <= v.MAX_CATEGORIES


def test_the_rest_of_the_package_uses_it():
    import stepscope
    from stepscope.analysis import PHASES
    from stepscope.analysis.store import reader
    from stepscope.analysis.tables import gpu, stepping
    from stepscope.core import annotations, config, gpu_records

    assert stepscope.CATEGORIES == v.CATEGORIES and annotations.MODES == v.MODES
    assert annotations.PHASES == v.PHASE_NAMES and PHASES == stepping.PHASES == v.PHASES
    assert config.DEFAULT_DIR == v.DEFAULT_DIR and config.GPU_MODES == v.GPU_MODES
    assert reader.KINDS == v.EVENT_KINDS and gpu.TYPES == v.GPU_TYPES
    # the writer's numbering and the reader's names are one table
    for kind, number in gpu_records.COPY_KINDS.items():
        assert gpu.COPY_KINDS[number] == kind
    for kind, number in gpu_records.MEMORY_KINDS.items():
        assert gpu.MEMORY_KINDS[number] == kind
    for kind, number in gpu_records.SYNC_TYPES.items():
        assert gpu.SYNC_TYPES[number] == kind
    assert [gpu_records.KERNEL, gpu_records.MEMCPY, gpu_records.SYNC, gpu_records.DRIVER] == [
        v.GPU_TYPES.index(t) for t in ("kernel", "memcpy", "sync", "driver")]


def test_vocabulary_is_pure_python_and_imports_nothing():
    path = os.path.join(REPO, "core", "vocabulary.py")
    tree = ast.parse(open(path).read(), path)
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    # loadable on its own, without the package (and so without the native module or a framework)
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('vocabulary', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(m.PHASES, m.RUN_JSON, sorted(k for k in sys.modules if k.split('.')[0] in "
            "('stepscope', 'torch', 'tensorflow', 'keras', 'numpy')))")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("run.json []")


def test_names_are_written_out_only_in_the_vocabulary():
    """The readers, the command line and the compat layer spell no phase list, categories list,
    run-layout file name or default run folder of their own."""
    spelled = ['"trace.ssc"', '"run.json"', '"process.json"', '"stepscope-runs"', '".stepscope-cache"',
               '"report.html"', '("GetNext", "Forward"', '["GetNext", "Forward"', '("annotation", "phase"',
               '"Step:ModeKeys.TRAIN", "eval"']
    offenders = []
    for folder in ("analysis", "cli", "compat"):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith(".py"):
                    text = open(os.path.join(root, name)).read()
                    offenders += [f"{folder}/{name}: {s}" for s in spelled if s in text]
    assert not offenders, offenders
