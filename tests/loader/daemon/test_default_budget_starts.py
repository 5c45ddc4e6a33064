"""Every mode starts with the default settings (budget 2G, auto slots and clients) on every shared graph.

High-dimensional features make a batch of these small graphs a large share of the graph (a coauthor-physics
batch holds 19k of its 34k nodes, 626 MiB of 8415-dim rows): the slots must scale to the budget.
"""

import pytest

from loader.daemon.config import config_from_mapping
from loader.offline.importers import import_dataset
from loader.offline.prepare import PrepareOptions, prepare_dataset
from tests.daemon_harness import running_daemon
from tests.graphs import shared_graph

GRAPHS = ("cora-planetoid", "citeseer-planetoid", "amazon-photo", "coauthor-cs", "coauthor-physics")


@pytest.fixture(scope="module", params=GRAPHS)
def prepared(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    import_dataset(shared_graph(f"{request.param}.npz"), root / "raw", fmt="npz", memory_budget=1 << 30,
                   progress=False)
    prepare_dataset(root / "raw", root / "ds", PrepareOptions(num_partitions=32, memory_budget=1 << 30,
                                                              progress=False))
    return root / "ds"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hierarchical", "exact", "static"])
def test_starts_with_the_default_budget(prepared, mode, tmp_path):
    config = config_from_mapping({"dataset": {"path": str(prepared)}, "loader": {"mode": mode},
                                  "server": {"socket": str(tmp_path / "s.sock")}, "metrics": {"port": 0}})
    with running_daemon(config) as daemon:
        assert daemon.ready.is_set()
        assert daemon.sessions.clients >= 1 and daemon.sessions.slots >= 2
        assert daemon.sessions.total <= config.memory.budget
