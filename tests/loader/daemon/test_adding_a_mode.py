"""docs/ARCHITECTURE.md, "Adding a mode", followed step by step with a toy mode and nothing else: registered in a
fixture (restored after), it passes config validation, opens through ``open_mode``, serves the reference's batches
and refuses a budget it does not fit in the one line every mode uses. If the checklist stops being enough to add a
mode, this file fails."""

import threading
from dataclasses import dataclass

import numpy as np
import pytest

from loader.daemon.budget_plan import BudgetPlan, FixedPart, Part, budget_too_small, fixed_part
from loader.daemon.config import LoaderConfig, config_from_mapping
from loader.daemon.eval_stream import EvalAccess, ModeEval
from loader.daemon.fullgraph.fullgraph import FullGraphMode, RowsFor
from loader.daemon.mode import ModeSetup
from loader.daemon.modes import MODES, mode_class
from loader.daemon.serving import ServingContext
from loader.daemon.slot_sizing import SessionSizing
from loader.daemon.slot_source import DenseRows
from loader.daemon.status import format_status
from loader.format.dataset import Dataset, open_dataset
from loader.sampling.inmemory import epoch_batches_inmemory, load_in_memory
from loader.sampling.sampling import SampledPass, sample_pass
from proto.errors import UserError
from proto.messages import EpochEnd, StartEpoch
from proto.sizes import format_size
from tests.daemon_harness import connect, consume, daemon_config, running_daemon, small_dataset

BATCH_SIZE, FANOUTS = 64, (5, 3)


# step 3: a BudgetPlan whose parts start from the fixed part, refused by budget_too_small
@dataclass(frozen=True)
class ToyBudget(BudgetPlan):
    fixed: FixedPart
    held_bytes: int

    def parts(self) -> list[Part]:
        return [*self.fixed.parts(), ("graph and features", self.held_bytes)]

    @property
    def total(self) -> int:
        return sum(size for _, size in self.parts())

    def describe(self) -> str:
        return "memory plan (toy): " + " + ".join(f"{what} {format_size(size)}" for what, size in self.parts())


# step 2: a FullGraphMode named as its key, with open, sample, start_stream, eval_access, summary, close
class ToyMode(FullGraphMode):
    """The whole graph in RAM, superbatches of its own default length."""

    name = "toy"
    default_superbatch = 3  # step 1: a mode's own default is a class attribute, not a name test in config.py

    @classmethod
    def open(cls, setup: ModeSetup) -> "ToyMode":
        m, budget = setup.dataset.manifest, setup.serving.config.memory.budget
        held = 8 * (m.num_nodes + 1) + np.dtype(m.index_dtype.value).itemsize * m.num_edges + m.num_nodes * m.row_bytes
        plan = ToyBudget(setup.fixed, held)
        if plan.total > budget:
            raise budget_too_small(budget, cls.name, plan.parts(), "use another mode")
        return cls(setup.serving, setup.dataset, plan)

    def __init__(self, serving: ServingContext, dataset: Dataset, plan: ToyBudget) -> None:
        super().__init__(serving)
        self.budget_plan = plan
        self.superbatch = self.superbatch_for(serving.config)
        data = load_in_memory(dataset)
        self.graph = data.graph
        self.rows = DenseRows(data.features.reshape(-1).view(np.uint8), dataset.manifest.row_bytes)

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return sample_pass(self.graph, seeds, batch_size, fanouts, keys)

    def start_stream(self, stopped: threading.Event) -> RowsFor:
        return lambda sampled: self.rows

    def eval_access(self) -> EvalAccess:
        return ModeEval(self.slot_source(self.rows), self.sample)

    def summary(self) -> str:
        return f"superbatches of {self.superbatch}"

    def close(self) -> None:
        pass


@pytest.fixture
def toy_registered(monkeypatch):
    """Step 1: the registry entry (monkeypatch takes it out again)."""
    monkeypatch.setitem(MODES, "toy", f"{__name__}:ToyMode")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return small_dataset(tmp_path_factory.mktemp("toy"), nodes=2000, partitions=8)


def toy_config(dataset, tmp_path, budget="64M", **tables) -> LoaderConfig:
    return daemon_config(dataset, tmp_path / "s.sock", loader={"mode": "toy"}, memory={"budget": budget},
                         sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)}, **tables)


def test_the_registry_entry_is_all_config_validation_needs(toy_registered):
    config = config_from_mapping({"dataset": {"path": "/x"}, "loader": {"mode": "toy"}})
    assert config.loader.mode == "toy" and mode_class("toy") is ToyMode
    with pytest.raises(UserError, match="expected one of hierarchical, .*, toy, got 'fast'"):
        config_from_mapping({"dataset": {"path": "/x"}, "loader": {"mode": "fast"}})


def test_unregistered_the_mode_is_refused(monkeypatch):
    monkeypatch.delitem(MODES, "toy", raising=False)
    with pytest.raises(UserError, match="\\[loader\\] mode: expected one of .*, got 'toy'"):
        config_from_mapping({"dataset": {"path": "/x"}, "loader": {"mode": "toy"}})


def test_the_toy_mode_opens_and_serves_the_reference_batches(toy_registered, dataset, tmp_path):
    config = toy_config(dataset, tmp_path)
    reference = load_in_memory(open_dataset(dataset))
    with running_daemon(config) as daemon, connect(config) as client:
        assert isinstance(daemon.mode, ToyMode) and daemon.mode.superbatch == 3
        assert client.welcome.dataset.mode == "toy"
        batches, _ = consume(client, StartEpoch(epoch=0), EpochEnd)
    plan = epoch_batches_inmemory(reference.splits["train"], BATCH_SIZE, 0, 0)
    expected = sample_pass(reference.graph, plan.seeds, BATCH_SIZE, FANOUTS, plan.keys)
    assert len(batches) == expected.num_batches > 3  # several superbatches
    for b, (_, arrays) in enumerate(batches):
        want = expected.batch(b)
        np.testing.assert_array_equal(arrays["n_id"], want.nodes)
        np.testing.assert_array_equal(arrays["edge_index"], want.edge_index)
        assert arrays["x"].tobytes() == reference.features[want.nodes].tobytes()


def test_the_toy_mode_refuses_a_budget_it_does_not_fit_in_one_line(toy_registered, dataset, tmp_path):
    # slots given, so the budget decides nothing but the fit: the fixed part fits, the graph beside it does not
    tables = {"publisher": {"slots": 2, "slot_bytes": "1M"}, "server": {"max_clients": 1}}
    m = open_dataset(dataset).manifest
    fixed = fixed_part(m.num_nodes, SessionSizing(clients=1, slots=2, slot_bytes=1 << 20))
    budget = fixed.total + (m.num_nodes * m.row_bytes) // 2
    config = toy_config(dataset, tmp_path, budget, **tables)
    with pytest.raises(UserError) as err, running_daemon(config):
        pass
    message = str(err.value)
    assert message.startswith(f"memory budget {format_size(budget)} is too small for mode toy: node arrays ")
    assert "graph and features" in message and message.endswith("; raise [memory] budget or use another mode")
    assert "\n" not in message


def test_the_capabilities_default_to_what_a_plain_mode_needs(toy_registered):
    # step 4: no override, so no static cache, no quality line, no restriction on jobs across machines
    config = config_from_mapping({"dataset": {"path": "/x"}, "loader": {"mode": "toy"}})
    assert mode_class("toy").loads_static_cache(config) is False
    assert ToyMode.measures_quality is False and mode_class("hierarchical").measures_quality is True
    assert ToyMode.cross_machine_problem(object.__new__(ToyMode)) is None


@pytest.mark.parametrize("measures, shown", [("true", True), ("false", False)])
def test_status_shows_quality_by_the_capability_not_the_name(measures, shown):
    samples = {("megabatch_build_info", (("dataset", "d"), ("measures_quality", measures), ("mode", "toy"),
                                         ("version", "1"))): 1.0}
    assert ("training quality:" in format_status(samples)) is shown
