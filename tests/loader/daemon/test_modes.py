"""The mode registry: every entry names a mode that calls itself by its key, lookups import only the mode looked up,
and a name nobody registered is one line listing those that are."""

import json
import subprocess
import sys

import pytest

from loader.daemon.mode import TrainingMode
from loader.daemon.modes import MODES, mode_class
from proto.errors import UserError
from tests.paths import REPO_ROOT


@pytest.mark.parametrize("name", list(MODES))
def test_every_entry_is_a_mode_named_by_its_key(name):
    cls = mode_class(name)
    assert issubclass(cls, TrainingMode) and cls.name == name


def test_an_unknown_mode_is_one_line_listing_every_registered_one():
    with pytest.raises(UserError) as err:
        mode_class("fast")
    assert str(err.value) == ("[loader] mode: expected one of hierarchical, exact, static, staged, hybrid, mmap, "
                              "inmemory, got 'fast'")


def test_an_entry_that_names_another_mode_is_a_registry_bug(monkeypatch):
    monkeypatch.setitem(MODES, "quick", MODES["exact"])
    with pytest.raises(TypeError, match="MODES\\['quick'\\] .* is not a TrainingMode named 'quick'"):
        mode_class("quick")


LOOKUP = """
import json, sys
from loader.daemon.config import config_from_mapping
config_from_mapping({"dataset": {"path": "/x"}, "loader": {"mode": "exact"}})
after_config = sorted(m for m in sys.modules if m.startswith(("loader.daemon.fullgraph", "loader.daemon.hierarchical")))
from loader.daemon.modes import mode_class
mode_class("exact")
after_lookup = sorted(m for m in sys.modules if m.startswith(("loader.daemon.fullgraph", "loader.daemon.hierarchical")))
print(json.dumps({"config": after_config, "lookup": after_lookup}))
"""


def test_config_imports_no_mode_and_a_lookup_only_the_one_looked_up():
    run = subprocess.run([sys.executable, "-c", LOOKUP], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    imported = json.loads(run.stdout.strip().splitlines()[-1])
    assert imported["config"] == []
    assert "loader.daemon.fullgraph.outofcore" in imported["lookup"]
    for other in ("loader.daemon.fullgraph.staged", "loader.daemon.fullgraph.hybrid",
                  "loader.daemon.fullgraph.fullgraph_modes", "loader.daemon.hierarchical.mode"):
        assert other not in imported["lookup"]
