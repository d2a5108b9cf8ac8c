"""The layout is the architecture (docs/design.md, "Layers"): the core knows no
framework, no integration and no analysis; each integration is an adapter over
the core; analysis reads the on-disk format through the core's vocabulary, never
an integration; the native code is laid out by part and includes only down.

Every import counts: at module level or in a function, relative or absolute, and
``sys.modules`` look-ups of stepscope modules (an import in all but name). No
framework is needed: this runs wherever the tests run."""

import ast
import os
import re

import pytest
from conftest import REPO

from stepscope.core import frameworks, plugins

# The frameworks stepscope knows (core/frameworks.py), and other heavy libraries no layer below
# the integrations may import.
FRAMEWORKS = {f.module for f in frameworks.FRAMEWORKS} | {"pyspark"}
# The Python folders as installed (pyproject.toml's wheel.packages) and what each may import.
MAY_IMPORT = {
    "core": {"core"},
    "integrations": {"core", "integrations"},
    "analysis": {"core", "analysis"},
    "compat": {"core", "compat", "integrations", "analysis"},  # SageMaker's APIs, over the others
    "cli": {"core", "analysis", "cli"},
}
# csrc/'s parts and the parts each may include (module.cc, the bindings, includes them all).
MAY_INCLUDE = {
    # the hot Python entry points (Span, span, now...), split out of module.cc: bindings
    # as module.cc is, so above every part
    "bindings": {"aggregate", "common", "read", "record", "steps", "torch", "bindings"},
    # the analysis's native passes over decoded columns: nothing of the recording side
    "aggregate": {"common", "aggregate"},
    "common": {"common"},
    "read": {"common", "read"},
    "record": {"common", "record"},
    "steps": {"common", "record", "steps"},
    "torch": {"common", "record", "steps", "torch"},
}


def _python_files(folder):
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.join(root, f)


def _package_of(path):
    """The dotted package a source file is installed as (stepscope.<folder>...)."""
    rel = os.path.relpath(path, REPO)[:-3].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return "stepscope." + ".".join(rel)


def imports(path):
    """(line, dotted name) of everything the file imports, sys.modules look-ups included."""
    tree = ast.parse(open(path).read(), path)
    here = _package_of(path).split(".")
    if not path.endswith("__init__.py"):
        here = here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _sys_modules_names(path):
    """Names looked up in sys.modules: sys.modules.get("x") and sys.modules["x"]."""
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, args = node.func.value, node.args
        elif isinstance(node, ast.Subscript):
            target, args = node.value, [node.slice]
        if (target is not None and isinstance(target, ast.Attribute) and target.attr == "modules"
                and isinstance(target.value, ast.Name) and target.value.id == "sys" and args
                and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)):
            yield node.lineno, args[0].value


def _edges(folder):
    for path in _python_files(folder):
        rel = os.path.relpath(path, REPO)
        for line, name in imports(path):
            yield rel, line, name
        for line, name in _sys_modules_names(path):
            yield rel, line, name


def test_each_python_folder_imports_only_what_its_layer_may():
    bad = []
    for folder, allowed in MAY_IMPORT.items():
        for rel, line, name in _edges(folder):
            parts = name.split(".")
            if parts[0] in FRAMEWORKS and folder in ("core", "analysis", "cli"):
                bad.append(f"{rel}:{line}: imports the framework {name}")
            if parts[0] != "stepscope":
                continue
            if len(parts) == 1 or parts[1] not in MAY_IMPORT:  # the package's front file (or a name of it)
                if folder not in ("cli", "compat"):  # the two layers above the front file
                    bad.append(f"{rel}:{line}: imports the package front ({name}), which sits above every layer")
            elif parts[1] not in allowed:
                bad.append(f"{rel}:{line}: {folder} imports {name}")
    assert not bad, "\n".join(bad)


def test_sys_modules_reach_ins_are_seen_as_imports():
    """The import graph above counts them: a reach-in of the Keras integration into
    the torch one is an edge like any import (and private names stay private)."""
    names = {name for folder in MAY_IMPORT for _, _, name in _edges(folder)}
    looked_up = {name for path in _python_files("integrations") for _, name in _sys_modules_names(path)}
    assert looked_up and looked_up <= names


def test_no_integration_touches_another_integrations_private_names():
    root = os.path.join(REPO, "integrations")
    integrations = [d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("_")]
    bad = []
    for own in integrations:
        for path in _python_files(os.path.join("integrations", own)):
            tree = ast.parse(open(path).read(), path)
            rel = os.path.relpath(path, REPO)
            aliases = {}  # local name -> the sibling integration it is
            for line, name in list(imports(path)) + list(_sys_modules_names(path)):
                other = name.split(".")
                if other[:2] != ["stepscope", "integrations"] or len(other) < 3 or other[2] == own \
                        or other[2] not in integrations:
                    continue
                if any(part.startswith("_") for part in other[3:]):
                    bad.append(f"{rel}:{line}: imports {name}")
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "stepscope.integrations":
                    for alias in node.names:
                        if alias.name in integrations and alias.name != own:
                            aliases[alias.asname or alias.name] = alias.name
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                        isinstance(node.targets[0], ast.Name):
                    for _, name in _sys_modules_names_of(node.value):
                        other = name.split(".")
                        if other[:2] == ["stepscope", "integrations"] and len(other) == 3 and other[2] != own:
                            aliases[node.targets[0].id] = other[2]
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id in aliases and node.attr.startswith("_")):
                    bad.append(f"{rel}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def _sys_modules_names_of(expr):
    for node in ast.walk(expr):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "modules"
                and node.args and isinstance(node.args[0], ast.Constant)):
            yield node.lineno, node.args[0].value


# The native module is the core's own (docs/design.md, "The native module is a guest"): every
# other layer records through stepscope.core.recording and reads through stepscope.core.decoding.
# The one exception is the torch integration's single caller of the torch-only native submodule.
NATIVE = "stepscope.core._native"
MAY_IMPORT_NATIVE = {"integrations/torch/_native_hooks.py"}


def test_only_the_core_imports_the_native_module():
    allowed = MAY_IMPORT_NATIVE
    bad = [f"{rel}:{line}: imports {name} (record through stepscope.core.recording)"
           for folder in MAY_IMPORT if folder != "core"
           for rel, line, name in _edges(folder)
           if (name == NATIVE or name.startswith(NATIVE + ".")) and rel.replace(os.sep, "/") not in allowed]
    assert not bad, "\n".join(bad)


def test_the_framework_registry_is_what_zero_edit_start_registers():
    """pyproject.toml's instrumentor entry points are core/frameworks.py's integrations, each
    under the module whose import turns it on; every integration folder (not the private
    helpers, not the _template to copy) handles a framework of the registry."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        groups = tomllib.load(f)["project"]["entry-points"]
    assert not set(groups) & {old for names in plugins.LEGACY_NAMES.values() for old in names}
    expected = {f.instrument_on: f"stepscope.integrations.{f.integration}:instrumentor"
                for f in frameworks.FRAMEWORKS if f.integration}
    assert groups[plugins.INSTRUMENTORS] == expected
    root = os.path.join(REPO, "integrations")
    folders = {d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("_")}
    assert folders - {"__pycache__"} == {f.integration for f in frameworks.FRAMEWORKS if f.integration}


def _includes(path):
    for line_no, line in enumerate(open(path), 1):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if m:
            yield line_no, m.group(1)


def test_native_parts_include_only_down():
    csrc = os.path.join(REPO, "csrc")
    bad, seen = [], set()
    for root, _, files in os.walk(csrc):
        for f in sorted(files):
            if not f.endswith((".cc", ".h")):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, csrc)
            part = rel.split(os.sep)[0] if os.sep in rel else None
            if part is not None:
                seen.add(part)
                assert part in MAY_INCLUDE, f"csrc/{rel}: a part the layout does not know ({part})"
            elif f != "module.cc":
                bad.append(f"csrc/{rel}: outside every part")
            for line, name in _includes(path):
                target = os.path.join(csrc, name)
                if not os.path.isfile(target):
                    bad.append(f"csrc/{rel}:{line}: includes {name}, which is no file under csrc/")
                    continue
                other = name.split("/")[0]
                if part is not None and other not in MAY_INCLUDE[part]:
                    bad.append(f"csrc/{rel}:{line}: {part} includes {name}")
    assert seen == set(MAY_INCLUDE), seen
    assert not bad, "\n".join(bad)


def test_the_core_knows_no_framework_by_name():
    """Nothing in core/ or csrc/'s framework-free parts names torch's or TensorFlow's
    modules in code (strings in docs aside): the one torch-only part is csrc/torch/."""
    bad = []
    for rel, line, name in _edges("core"):
        if name.split(".")[0] in FRAMEWORKS:
            bad.append(f"{rel}:{line}: {name}")
    assert not bad, bad


def test_the_contract_in_docs_is_the_contract():
    """Comments cite "SPEC §N": docs/SPEC.md is that contract, word for word the one the
    project is held to (../shared/SPEC.md beside a development checkout)."""
    ours = open(os.path.join(REPO, "docs", "SPEC.md")).read()
    assert ours.startswith("# stepscope product contract") and "## 3." in ours
    shared = os.path.join(REPO, os.pardir, "shared", "SPEC.md")
    if os.path.isfile(shared):
        assert open(shared).read() == ours, "docs/SPEC.md differs from ../shared/SPEC.md: copy it again"


# --- import cycles ------------------------------------------------------------------------
# Strongly connected components the layout tolerates (each a sorted list of modules): none. A
# cycle found is a layering bug to fix (issue 42 untangled the last: core's safety -> session,
# the Keras callback <-> its instrumentors), not one to list here.
ALLOWED_CYCLES: list = []


# Compiled modules (CMakeLists.txt installs them): leaves of the graph, importing nothing of ours.
NATIVE_MODULES = {"stepscope.core._native"}


def _modules():
    """{dotted module name: source path} of every stepscope module, the package front included."""
    out = {name: None for name in NATIVE_MODULES}
    for folder in MAY_IMPORT:
        for path in _python_files(folder):
            out[_package_of(path)] = path
    for f in ("__init__.py", "__main__.py"):  # package/ is installed as stepscope itself
        path = os.path.join(REPO, "package", f)
        if os.path.isfile(path):
            out["stepscope" if f == "__init__.py" else "stepscope.__main__"] = path
    return out


def _module_of(name, modules):
    """The module a dotted name lives in: the longest prefix that is a module."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def import_graph():
    """{module: {modules it imports}}, every import counted (in functions too). ``from
    package import submodule`` is an edge to the submodule alone: the package's own
    names are needed only when one of them is imported."""
    modules = _modules()
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        if path is None:  # compiled
            continue
        by_line = {}
        for line, name in list(imports(path)) + list(_sys_modules_names(path)):
            by_line.setdefault(line, []).append(name)
        for names in by_line.values():
            for name in names:
                target = _module_of(name, modules)
                if target is None or target == module:
                    continue
                if target == name and any(other.startswith(name + ".") for other in names):
                    continue  # the base of `from X import a, b`: a and b say what is needed
                graph[module].add(target)
    return graph


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _one_cycle(graph, component):
    """A path through the component from its first module back to it, for the message."""
    members, start = set(component), component[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & members):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return component


def test_no_import_cycles():
    """No module imports, directly or through others, a module that imports it: each
    part has one place in the flow, and no import hides in a function to dodge a cycle."""
    graph = import_graph()
    assert "stepscope.analysis.run" in graph and "stepscope" in graph
    found = _cycles(graph)
    allowed = [sorted(c) for c in ALLOWED_CYCLES]
    bad = [c for c in found if c not in allowed]
    assert not bad, "import cycles:\n" + "\n".join(" -> ".join(_one_cycle(graph, c)) for c in bad)


# Analysis is layered by its flow (docs/design.md, "Tables"): the stores decode and hold
# tables, built from the recipes they are given, and know no builder; the builders read
# the stores' frames and know no figure, rule or report above them.
ANALYSIS_MAY_IMPORT = {
    "analysis/store": {"stepscope.core", "stepscope.analysis.store"},
    "analysis/tables": {"stepscope.core", "stepscope.analysis.store", "stepscope.analysis.tables"},
}


def test_the_stores_know_no_builder_and_the_builders_nothing_above_them():
    bad = []
    for folder, allowed in ANALYSIS_MAY_IMPORT.items():
        for rel, line, name in _edges(folder):
            if name.split(".")[0] == "stepscope" and not any(name == a or name.startswith(a + ".") for a in allowed):
                bad.append(f"{rel}:{line}: {folder} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_tables_reference_is_generated_from_the_declarations():
    from stepscope.analysis.tables.reference import tables_markdown

    with open(os.path.join(REPO, "docs", "tables.md")) as f:
        assert f.read().strip() == tables_markdown().strip(), "regenerate docs/tables.md (see its first line)"
