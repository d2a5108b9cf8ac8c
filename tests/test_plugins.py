"""core/plugins.py: one loader of entry-point groups, under their dotted names and the
older underscore names, where a broken plugin is reported once and skipped."""

import sys

import pytest

from stepscope.core import plugins


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """installed(name, entry_points_txt, **modules): a distribution on sys.path, as pip leaves it
    (names without dashes: importlib.metadata names a dist-info folder by its stem's first part)."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def install(name, entry_points_txt, **modules):
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(entry_points_txt)
        for module, source in modules.items():
            (site / f"{module}.py").write_text(source)
            sys.modules.pop(module, None)

    yield install
    for name in [m for m in sys.modules if m.startswith("plugin_")]:
        del sys.modules[name]


def _ours(group):
    return sorted((ep.name, ep.value) for ep in plugins.entry_points(group) if ep.value.startswith("plugin_"))


def test_a_group_is_read_under_its_dotted_and_its_older_name_each_entry_once(installed):
    installed("plugin_new", "[stepscope.startup]\nnew = plugin_a:set_up\n", plugin_a="def set_up(): pass\n")
    installed("plugin_old", "[stepscope_startup]\nold = plugin_b:set_up\n", plugin_b="def set_up(): pass\n")
    both = "both = plugin_c:set_up\n"
    installed("plugin_both", f"[stepscope.startup]\n{both}[stepscope_startup]\n{both}", plugin_c="def set_up(): pass\n")
    assert _ours(plugins.STARTUP) == [("both", "plugin_c:set_up"), ("new", "plugin_a:set_up"),
                                      ("old", "plugin_b:set_up")]
    assert _ours(plugins.RULES) == []


def test_a_plugin_that_fails_to_load_is_reported_once_and_skipped(installed, capsys):
    installed("plugin_good", "[stepscope.startup]\ngood = plugin_good:set_up\n", plugin_good="def set_up(): pass\n")
    installed("plugin_bad", "[stepscope.startup]\nbad = plugin_bad:set_up\n", plugin_bad="raise ImportError('no')\n")
    for _ in range(2):
        loaded = {ep.name for ep, _ in plugins.load_group(plugins.STARTUP) if ep.value.startswith("plugin_")}
        assert loaded == {"good"}
    err = capsys.readouterr().err
    assert err.count("the plugin bad = plugin_bad:set_up") == 1 and "ImportError: no" in err

    reported = []
    assert plugins.load(next(ep for ep in plugins.entry_points(plugins.STARTUP) if ep.name == "bad"),
                        reported.append) is None
    assert len(reported) == 1 and "not loaded" in reported[0]
