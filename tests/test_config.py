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
