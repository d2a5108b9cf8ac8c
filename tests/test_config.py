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
])
def test_errors_name_the_variable_and_allowed_values(env, match):
    with pytest.raises(ConfigError, match=match):
        resolve(env=env)


def test_unknown_keyword():
    with pytest.raises(TypeError, match="unknown stepscope option"):
        resolve(env={}, intervall=5)
