"""The loader never imports torch: the daemon and the offline tools run without it (only ``megabatch train``,
in its own interpreter, loads it)."""

import json
import subprocess
import sys

from tests.paths import REPO_ROOT

IMPORT_ALL = """
import importlib, json, pkgutil, sys
import loader
names = ["loader"]
for info in pkgutil.walk_packages(loader.__path__, "loader.", onerror=lambda name: sys.exit("cannot walk " + name)):
    importlib.import_module(info.name)
    names.append(info.name)
torch = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torch_geometric"))
print(json.dumps({"imported": names, "torch": torch}))
"""


def test_importing_every_loader_module_never_imports_torch():
    run = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # the walk reached every layer, the daemon's subpackages included
    for name in ("loader.cli", "loader.format.dataset", "loader.offline.prepare", "loader.sampling.exact_sampling",
                 "loader.caches.feature_cache", "loader.daemon.server", "loader.daemon.hierarchical.pipeline",
                 "loader.daemon.fullgraph.outofcore"):
        assert name in result["imported"]
    assert result["torch"] == []
