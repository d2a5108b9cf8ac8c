"""Settings: keywords over variables over defaults, each error names its setting."""

import pytest

from stepscope.core.config import ConfigError, resolve
from stepscope.core.vocabulary import DEFAULT_DIR


def test_defaults():
    c = resolve(env={})
    assert (c.dir, c.name, c.interval_ms, c.gpu, c.steps) == (DEFAULT_DIR, None, 100, "auto", None)


def test_environment_and_keyword_precedence():
    env = {"STEPSCOPE_DIR": "/x", "STEPSCOPE_INTERVAL_MS": "250", "STEPSCOPE_GPU": "Metrics",
           "STEPSCOPE_STEPS": "10-20", "STEPSCOPE_RUN": "r1"}
    c = resolve(env=env)
    assert (c.dir, c.interval_ms, c.gpu, c.steps, c.name) == ("/x", 250, "metrics", (10, 20), "r1")
    c = resolve(env=env, interval_ms=10, steps="5", name="r2")
    assert (c.interval_ms, c.steps, c.name) == (10, (5, 5), "r2")


@pytest.mark.parametrize("env,match", [
    ({"STEPSCOPE_INTERVAL_MS": "9"}, "STEPSCOPE_INTERVAL_MS=9 is out of range; allowed: 10 to 60000"),
    ({"STEPSCOPE_INTERVAL_MS": "abc"}, "STEPSCOPE_INTERVAL_MS='abc' is not an integer"),
    ({"STEPSCOPE_GPU": "yes"}, "STEPSCOPE_GPU='yes' is not valid; allowed: auto, off, metrics, trace"),
    ({"STEPSCOPE_STEPS": "20-10"}, "STEPSCOPE_STEPS='20-10' is not valid"),
    ({"STEPSCOPE_STEPS": "ten"}, "allowed: 'all', N or FIRST-LAST"),
    ({"STEPSCOPE_RUN": "a/b"}, "STEPSCOPE_RUN='a/b' is not valid"),
    ({"STEPSCOPE_RUN": ".."}, "STEPSCOPE_RUN='..' is not valid"),
    ({"STEPSCOPE_RUN": "a\nb"}, r"STEPSCOPE_RUN='a\\nb' is not valid: it contains a control character"),
    ({"STEPSCOPE_RUN": "x\udcff"}, r"STEPSCOPE_RUN='x\\udcff' is not valid: it is not UTF-8"),
    ({"STEPSCOPE_DIR": "/tmp/\udcff"}, r"STEPSCOPE_DIR='/tmp/\\udcff' is not valid: it is not UTF-8"),
])
def test_errors_name_the_variable_and_allowed_values(env, match):
    with pytest.raises(ConfigError, match=match):
        resolve(env=env)


def test_unknown_keyword():
    with pytest.raises(TypeError, match="unknown stepscope option"):
        resolve(env={}, intervall=5)


@pytest.mark.parametrize("var", ["STEPSCOPE_RUN", "STEPSCOPE_DIR", "STEPSCOPE_GPU", "STEPSCOPE_STEPS",
                                 "STEPSCOPE_INTERVAL_MS", "STEPSCOPE_FLUSH_MS", "STEPSCOPE_BUFFER_MB",
                                 "STEPSCOPE_PYSAMPLE_HZ"])
def test_a_huge_value_is_shown_cut_to_80_characters(var):
    with pytest.raises(ConfigError) as info:
        resolve(env={var: "/" + "v" * 120_000})
    message = str(info.value)
    assert message.startswith(f"{var}='/vvvv") and "\n" not in message
    shown = message[len(var) + 1:].split(" is ")[0]
    assert len(shown) == 80 and shown.endswith("...")


def test_run_name_of_255_bytes_is_kept():
    assert resolve(env={"STEPSCOPE_RUN": "é" * 127 + "r"}).name == "é" * 127 + "r"  # 255 bytes
    with pytest.raises(ConfigError, match="longer than 255 bytes"):
        resolve(env={"STEPSCOPE_RUN": "é" * 128})


# Variables the product contract names for features of open issues, not built yet: allowed in
# docs/SPEC.md alone. The issue that builds one registers it (core/config.py) and drops it here.
CONTRACT_ONLY = {"STEPSCOPE_HANG_S": "issue 77 (hangs across ranks)", "STEPSCOPE_PEAK_TFLOPS": "issue 78 (MFU)"}


def _only_in_contract(repo, files, name):
    import os

    for rel in files:
        mentions = rel.endswith((".py", ".cc", ".h", ".md", ".toml", ".ini", ".sh"))
        if rel in ("docs/SPEC.md", "tests/test_config.py") or not mentions:
            continue
        try:
            with open(os.path.join(repo, rel), encoding="utf-8") as f:
                if name in f.read():
                    return False
        except (OSError, UnicodeDecodeError):
            continue
    return True


def test_every_stepscope_variable_in_the_tree_is_in_the_registry():
    """One registry (core/config.py VARIABLES) knows every STEPSCOPE_* name the
    project's files mention; the C preprocessor's own STEPSCOPE_* macros aside."""
    import os
    import re
    import subprocess

    from stepscope.core.config import VARIABLES

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    listed = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True)
    files = listed.stdout.split() if listed.returncode == 0 else [
        os.path.relpath(os.path.join(root, f), repo) for root, _, names in os.walk(repo) for f in names]
    word = re.compile(r"\bSTEPSCOPE(?:_[A-Z0-9]+)*\b")
    seen, macros = {}, set()
    for rel in files:
        if not rel.endswith((".py", ".cc", ".h", ".md", ".toml", ".ini", ".pth", ".start", ".sh", ".txt")):
            continue
        try:
            with open(os.path.join(repo, rel), encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        macros.update(re.findall(r"#\s*define\s+(STEPSCOPE_\w+)", text))
        for name in word.findall(text):
            seen.setdefault(name, rel)
    unknown = {n: where for n, where in seen.items() if n not in VARIABLES and n not in macros}
    # the contract (docs/SPEC.md, a copy of ../shared/SPEC.md) may name what an open issue builds:
    # only there, until that issue registers it
    planned = {n for n, where in unknown.items() if n in CONTRACT_ONLY and where == "docs/SPEC.md"}
    assert not planned - {n for n in planned if _only_in_contract(repo, files, n)}, planned
    unknown = {n: where for n, where in unknown.items() if n not in planned}
    assert not unknown, f"STEPSCOPE_* names the registry does not know (name: first file): {unknown}"
    assert "STEPSCOPE_DIR" in seen and "STEPSCOPE_CLOCK" in seen  # the scan found the tree


def test_no_environment_is_read_in_csrc():
    import os
    import re

    csrc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
    readers = []
    for root, _, names in os.walk(csrc):
        for f in names:
            with open(os.path.join(root, f), encoding="utf-8") as fh:
                if re.search(r"\b(secure_)?getenv\s*\(|\benviron\b", fh.read()):
                    readers.append(f)
    assert not readers, f"the native core takes its settings from core/config.py: {readers}"


def test_the_registry_says_who_sets_each_variable():
    from stepscope.core.config import ENV_VARIABLES, HANDOVER, TEST, TUNING, USER, VARIABLES

    assert {v.kind for v in VARIABLES.values()} == {USER, TUNING, HANDOVER, TEST}
    assert all(v.meaning for v in VARIABLES.values())
    assert set(ENV_VARIABLES) <= {n for n, v in VARIABLES.items() if v.kind == USER}
    for spec in ("STEPSCOPE", "STEPSCOPE_DIR", "STEPSCOPE_RUN", "STEPSCOPE_INTERVAL_MS", "STEPSCOPE_GPU",
                 "STEPSCOPE_STEPS"):
        assert VARIABLES[spec].kind == USER


@pytest.mark.parametrize("value,on", [("", True), ("1", True), ("yes", True), ("2", True),
                                      ("0", False), (" Off ", False), ("false", False), ("NO", False)])
def test_one_boolean_parser(value, on):
    from stepscope.core.config import flag

    assert flag("STEPSCOPE_OPS", env={"STEPSCOPE_OPS": value}) is on  # empty: the default, on
    assert flag("STEPSCOPE", env={"STEPSCOPE": value}) is (on and value != "")  # empty: off


def test_the_native_settings_and_their_errors(capsys):
    from stepscope.core.config import native_settings, setting

    assert native_settings(env={}) == {"clock": "auto", "pysample_method": "auto", "pysample_rt": True,
                                       "proc_root": ""}
    env = {"STEPSCOPE_CLOCK": "Monotonic", "STEPSCOPE_PYSAMPLE_METHOD": "gil", "STEPSCOPE_PYSAMPLE_RT": "0",
           "STEPSCOPE_PROC_ROOT": "/tmp/proc"}
    assert native_settings(env=env) == {"clock": "monotonic", "pysample_method": "gil", "pysample_rt": False,
                                        "proc_root": "/tmp/proc"}
    assert "clock" not in native_settings(env=env, clock=False)
    with pytest.raises(ConfigError, match="STEPSCOPE_CLOCK='tsc' is not valid; allowed: auto, monotonic"):
        setting("STEPSCOPE_CLOCK", env={"STEPSCOPE_CLOCK": "tsc"})
    # where an error would stop the job: one line, and the default
    assert native_settings(env={"STEPSCOPE_PYSAMPLE_METHOD": "fast"})["pysample_method"] == "auto"
    assert "STEPSCOPE_PYSAMPLE_METHOD='fast' is not valid; allowed: auto, frames, gil" in capsys.readouterr().err


def test_the_autostart_files_off_words_are_the_registrys():
    import os

    from stepscope.core.config import OFF_WORDS

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(repo, "package", "_stepscope_autostart.py"), encoding="utf-8") as f:
        words = "(" + ", ".join(f'"{w}"' for w in ("",) + OFF_WORDS) + ")"
        assert words in f.read()  # it runs before stepscope may be imported: its own copy
