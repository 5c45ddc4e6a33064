"""The loader never imports torch: the daemon and the offline tools run without it (only ``megabatch train``,
in its own interpreter, loads it); and every package imports only the layers docs/ARCHITECTURE.md puts below it."""

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
    and proto/jit.py, proto imports neither loader nor trainer, loader never trainer (the order of the loader's
    own layers: test_the_loader_layers_import_in_order)."""
    broken = []
    for path in sorted(REPO_ROOT.glob("*/**/*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if rel.split("/")[0] not in ("loader", "trainer", "proto"):
            continue
        if "numba" in imports_of(path) and not (path.stem.endswith("_kernels") or rel == "proto/jit.py"):
            broken.append(f"{rel} imports numba")
    for path in sorted(REPO_ROOT.glob("loader/**/*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        names = imports_of(path)
        if "asyncio" in names and not rel.startswith("loader/daemon/"):
            broken.append(f"{rel} imports asyncio")
        if "trainer" in names:
            broken.append(f"{rel} imports trainer")
    for path in sorted(REPO_ROOT.glob("proto/**/*.py")):
        wrong = sorted(imports_of(path) & {"loader", "trainer", "torch"})
        if wrong:
            broken.append(f"{path.relative_to(REPO_ROOT).as_posix()} imports {wrong}")
    assert broken == []


LOADER_LAYERS = ["format", "sampling", "caches", "staging", "daemon", "cli"]
"""docs/ARCHITECTURE.md, "Layers": the loader's layers, lowest first (``cli`` is loader/cli.py). A module imports
from its own layer and the layers before it, never from one after it."""
OFFLINE = "offline"
"""The offline tools: beside the chain, they import ``format`` only, and only ``cli`` imports them (the daemon
never does)."""
OFFLINE_IMPORTS = {"format"}
SHARED = "the loader package"
"""``loader`` itself (its ``__version__``) and its top-level helper ``memory``: any layer imports them, and they
import no layer."""
SHARED_MODULES = {"memory"}


def loader_layer(module: str) -> str | None:
    """The layer of a ``loader`` module ("loader.daemon.jobs" -> "daemon"); None for a module of no layer."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in SHARED_MODULES:
        return SHARED
    if parts[1] in LOADER_LAYERS or parts[1] == OFFLINE:
        return parts[1]
    return None


def is_module(name: str) -> bool:
    """Whether ``loader.<name>`` is a module or package (and not an attribute of ``loader``)."""
    return (REPO_ROOT / "loader" / name).is_dir() or (REPO_ROOT / "loader" / f"{name}.py").is_file()


def loader_imports(module: str, is_package: bool, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every ``loader`` module that ``tree`` imports anywhere (function bodies and
    TYPE_CHECKING blocks included); relative imports resolved against ``module``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[:len(module.split(".")) - (0 if is_package else 1)]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            # ``from loader import daemon`` imports a subpackage, ``from loader import __version__`` the package
            found += [(node.lineno, f"{base}.{alias.name}" if base == "loader" and is_module(alias.name) else base)
                      for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "loader"]


def layer_violation(importer: str, imported: str) -> str | None:
    """Why ``importer``'s layer may not import ``imported``'s, or None when it may."""
    src, dst = loader_layer(importer), loader_layer(imported)
    if dst is None:
        return f"{imported} belongs to no layer (add its package to LOADER_LAYERS and docs/ARCHITECTURE.md)"
    if src == dst or dst == SHARED:
        return None
    if src == SHARED:
        return f"{SHARED} ({importer}) imports no layer"
    if dst == OFFLINE:
        return None if src == "cli" else f"only cli imports {OFFLINE}"
    if src == OFFLINE:
        return None if dst in OFFLINE_IMPORTS else f"{OFFLINE} imports only {sorted(OFFLINE_IMPORTS)}"
    assert src is not None and src in LOADER_LAYERS and dst in LOADER_LAYERS
    if LOADER_LAYERS.index(dst) > LOADER_LAYERS.index(src):
        return f"{src} is below {dst} in LOADER_LAYERS"
    return None


def module_name(path: pathlib.Path) -> str:
    """loader/daemon/jobs.py -> loader.daemon.jobs; loader/daemon/__init__.py -> loader.daemon."""
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


def layer_violations(path: pathlib.Path, source: str) -> list[str]:
    """One line per import in ``source`` (the file ``path`` under REPO_ROOT) that breaks the layer order."""
    rel, module = path.relative_to(REPO_ROOT), module_name(path)
    if loader_layer(module) is None:
        return [f"{rel.as_posix()}: {module} belongs to no layer (add it to LOADER_LAYERS and docs/ARCHITECTURE.md)"]
    broken = []
    for line, imported in loader_imports(module, path.name == "__init__.py", ast.parse(source, str(path))):
        why = layer_violation(module, imported)
        if why is not None:
            broken.append(f"{rel.as_posix()}:{line} imports {imported}: {why}")
    return broken


def test_the_loader_layers_import_in_order():
    """docs/ARCHITECTURE.md's table: format < offline; format < sampling < caches < staging < daemon < cli;
    only cli imports offline."""
    paths = sorted(REPO_ROOT.glob("loader/**/*.py"))
    broken = [line for path in paths for line in layer_violations(path, path.read_text())]
    assert broken == [], "imports against the layer order (docs/ARCHITECTURE.md, \"Layers\"):\n" + "\n".join(broken)
    # the walk reached every layer
    seen = {loader_layer(module_name(path)) for path in paths}
    assert seen == {*LOADER_LAYERS, OFFLINE, SHARED}


def test_the_layer_check_names_each_offending_import():
    def check(rel: str, source: str) -> list[str]:
        return layer_violations(REPO_ROOT / rel, source)

    assert check("loader/daemon/jobs.py", "from loader.offline.prepare import prepare_dataset\n") == [
        "loader/daemon/jobs.py:1 imports loader.offline.prepare: only cli imports offline"]
    assert check("loader/sampling/inmemory.py", "import numpy\n\ndef f():\n    from ..caches import changeset\n") == [
        "loader/sampling/inmemory.py:4 imports loader.caches: sampling is below caches in LOADER_LAYERS"]
    assert check("loader/offline/verify.py", "from loader.sampling.sampling import CSCGraph\n") == [
        "loader/offline/verify.py:1 imports loader.sampling.sampling: offline imports only ['format']"]
    assert check("loader/format/npyio.py", "from loader import daemon\n") == [
        "loader/format/npyio.py:1 imports loader.daemon: format is below daemon in LOADER_LAYERS"]
    assert check("loader/memory.py", "from loader.format import dataset\n") == [
        "loader/memory.py:1 imports loader.format: the loader package (loader.memory) imports no layer"]
    assert check("loader/daemon/__init__.py", "from .jobs import Job\nfrom loader import __version__\n") == []
    assert check("loader/cli.py", "from loader.offline import prepare\nfrom loader.daemon import server\n") == []
    assert check("loader/extra/thing.py", "") == [
        "loader/extra/thing.py: loader.extra.thing belongs to no layer (add it to LOADER_LAYERS and "
        "docs/ARCHITECTURE.md)"]
