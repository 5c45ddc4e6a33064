"""The loader never imports torch: the daemon and the offline tools run without it (only ``megabatch train``,
in its own interpreter, loads it)."""

import ast
import json
import pathlib
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


def imports_of(path: pathlib.Path) -> set[str]:
    """Top-level packages ``path`` imports anywhere in its source (function bodies included)."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_layers_hold():
    """docs/ARCHITECTURE.md, "Layers": asyncio only under loader/daemon/, numba only in *_kernels.py
    and jit.py, proto imports neither loader nor trainer, loader never trainer, and the offline tools
    are not imported by the daemon."""
    broken = []
    for path in sorted(REPO_ROOT.glob("loader/**/*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        names = imports_of(path)
        if "asyncio" in names and not rel.startswith("loader/daemon/"):
            broken.append(f"{rel} imports asyncio")
        if "numba" in names and not (path.stem.endswith("_kernels") or rel == "loader/jit.py"):
            broken.append(f"{rel} imports numba")
        if "trainer" in names:
            broken.append(f"{rel} imports trainer")
        if rel.startswith("loader/daemon/") and "loader.offline" in path.read_text():
            broken.append(f"{rel} imports loader.offline")
    for path in sorted(REPO_ROOT.glob("proto/**/*.py")):
        wrong = sorted(imports_of(path) & {"loader", "trainer", "torch"})
        if wrong:
            broken.append(f"{path.relative_to(REPO_ROOT).as_posix()} imports {wrong}")
    assert broken == []
