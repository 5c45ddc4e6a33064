"""The exact/static/staged/hybrid modes' memory split: every part charged, auto caches fill what is left, bad sizes
refused."""

import mmap
import os
from pathlib import Path

import pytest

from loader.daemon.config import config_from_mapping
from loader.daemon.fullgraph import outofcore
from loader.daemon.fullgraph.fullgraph import SUPERBATCHES_IN_FLIGHT
from loader.daemon.fullgraph.outofcore import (
    BYTES_PER_SAMPLED_EDGE,
    BYTES_PER_SAMPLED_NODE,
    HYBRID_BYTES_PER_SAMPLED_NODE,
    HYBRID_RESIDENT_SHARE,
    SPILLED_BATCH_BYTES,
    STAGING_CHUNK,
    STAGING_CHUNK_SMALL,
    STAGING_FLUSH,
    plan_outofcore,
)
from loader.daemon.modes import mode_class
from loader.format.dataset import open_dataset
from loader.staging.scratch_files import takes_direct_writes
from loader.staging.sequential_reader import reader_buffer_bytes
from loader.staging.stager import stager_buffer_bytes
from loader.staging.window_plan import PLAN_SLICE_ROWS, plan_window_bytes
from proto.client import ControlClient
from proto.errors import UserError
from proto.messages import BatchReady, Credit, EpochEnd, Release, StartEpoch
from tests.daemon_harness import small_dataset


@pytest.fixture(scope="module")
def dataset(dataset_3k):
    """``dataset_3k`` opened: the plans read its manifest."""
    return open_dataset(dataset_3k)


def config(budget, mode="exact", **fullgraph):
    return config_from_mapping({"dataset": {"path": "/x"}, "loader": {"mode": mode}, "memory": {"budget": budget},
                                "fullgraph": fullgraph})


def plan_for(cfg, dataset, **sizes):
    """``cfg``'s mode's plan: the hooks of the class the registry names."""
    return plan_outofcore(mode_class(cfg.loader.mode), cfg, dataset, **sizes)


def test_auto_split_uses_the_budget_and_gives_lists_at_most_half(dataset):
    plan = plan_for(config("64M"), dataset, fixed_bytes=1 << 20, batch_nodes=500, batch_edges=1000)
    m = dataset.manifest
    all_lists = 8 * m.num_nodes + 4 * m.num_edges
    assert plan.neighbor_cache_bytes == all_lists  # they fit in half of what is left
    assert plan.feature_cache_rows == m.num_nodes  # more rows than nodes are never allocated
    assert plan.total <= 64 << 20
    base = plan_for(config("16M", superbatch=4), dataset, fixed_bytes=1 << 20, batch_nodes=500, batch_edges=1000)
    budget = base.fixed_bytes + base.graph_bytes + base.working_bytes + 150_000  # caches get 150 kB: less than all
    tight = plan_for(config(budget, superbatch=4), dataset, fixed_bytes=1 << 20, batch_nodes=500,
                     batch_edges=1000)
    assert tight.neighbor_cache_bytes == 75_000 < all_lists  # half of what is left
    assert tight.feature_cache_rows == 75_000 // m.row_bytes < m.num_nodes and tight.total <= budget
    assert "feature cache" in tight.describe() and "superbatches in flight" in tight.describe()


def test_explicit_and_zero_caches(dataset):
    plan = plan_for(config("64M", neighbor_cache=0, feature_cache=0), dataset, fixed_bytes=0, batch_nodes=500,
                    batch_edges=1000)
    assert plan.neighbor_cache_bytes == 0 and plan.feature_cache_rows == 0
    with pytest.raises(UserError, match="too small for mode exact: .*neighbour cache .* feature cache 64 MiB = .*"
                       "lower \\[fullgraph\\] neighbor_cache"):
        plan_for(config("16M", superbatch=4, feature_cache="64M"), dataset, fixed_bytes=0, batch_nodes=500,
                 batch_edges=1000)


def test_a_budget_below_the_fixed_parts_is_refused_naming_what_to_lower(dataset):
    with pytest.raises(UserError, match="too small for mode exact.*lower \\[fullgraph\\] superbatch"):
        plan_for(config("4M", superbatch=512), dataset, fixed_bytes=0, batch_nodes=5000, batch_edges=50000)


def test_staged_charges_the_stager_and_gives_the_lists_all_they_need_first(dataset, monkeypatch):
    m = dataset.manifest
    # a staging_dir that refuses O_DIRECT first: staging writes through the page cache, two flushes' worth
    monkeypatch.setattr(outofcore, "_takes_direct_writes", lambda directory: False)
    exact = plan_for(config("256M", superbatch=4), dataset, fixed_bytes=1 << 20, batch_nodes=500,
                     batch_edges=1000)
    staged = plan_for(config("256M", mode="staged", superbatch=4), dataset, fixed_bytes=1 << 20, batch_nodes=500,
                      batch_edges=1000)
    assert staged.staging_chunk == STAGING_CHUNK and "staging chunks of 16 MiB" in staged.describe()
    stager = stager_buffer_bytes(row_bytes=m.row_bytes, batch_rows=500, chunk_bytes=STAGING_CHUNK,
                                 scatter_bytes=STAGING_CHUNK, flush_bytes=STAGING_FLUSH, on_disk=True)
    # a superbatch in flight is per-batch tables instead of the sampled pass (ids and edges are spilled); one is
    # planned at a time, its ids read back a slice at a time (int32 here: pages and their concatenation), one
    # sample group is held before its spill, and the publisher holds a batch's record and the next one's
    sampled_batch = 500 * BYTES_PER_SAMPLED_NODE + 1000 * BYTES_PER_SAMPLED_EDGE
    in_flight = 4 * SPILLED_BATCH_BYTES
    id_slice = 2 * 4 * (PLAN_SLICE_ROWS + 2 * 500)
    records = 2 * (500 * 4 + 1000 * 8)
    group = config("1M").fullgraph.sample_group
    group_records = group * (records // 2 + 2 * 4096)  # a sample group's records, laid out to be written at once
    assert staged.working_bytes == (exact.working_bytes - SUPERBATCHES_IN_FLIGHT * 4 * sampled_batch + stager
                                    + SUPERBATCHES_IN_FLIGHT * in_flight + plan_window_bytes(4 * 500) + id_slice
                                    + records + group * sampled_batch + group_records)
    assert staged.total <= 256 << 20
    all_lists = 8 * m.num_nodes + 4 * m.num_edges
    small_stager = stager_buffer_bytes(row_bytes=m.row_bytes, batch_rows=500, chunk_bytes=STAGING_CHUNK_SMALL,
                                       scatter_bytes=STAGING_CHUNK_SMALL, flush_bytes=STAGING_FLUSH, on_disk=True)
    room = staged.fixed_bytes + staged.graph_bytes + staged.working_bytes - stager + small_stager
    tight = plan_for(config(room + all_lists // 2, mode="staged", superbatch=4), dataset, fixed_bytes=1 << 20,
                     batch_nodes=500, batch_edges=1000)
    assert tight.neighbor_cache_bytes == all_lists // 2 and tight.feature_cache_rows == 0  # all of it to the lists
    # 16 MiB chunks would leave the lists no room there: small chunks
    assert tight.staging_chunk == STAGING_CHUNK_SMALL and tight.working_bytes == room - tight.fixed_bytes - \
        tight.graph_bytes
    roomier = plan_for(config(room + all_lists + 100 * m.row_bytes, mode="staged", superbatch=4), dataset,
                       fixed_bytes=1 << 20, batch_nodes=500, batch_edges=1000)
    assert roomier.neighbor_cache_bytes == all_lists and roomier.feature_cache_rows == 100  # then the rows
    with pytest.raises(UserError, match="too small for mode staged"):
        plan_for(config(room - 1000, mode="staged", superbatch=4), dataset, fixed_bytes=1 << 20,
                 batch_nodes=500, batch_edges=1000)
    # a staging_dir that takes O_DIRECT writes (whatever [io] direct_io says: off here): a page per batch of a
    # superbatch and a second scatter buffer (a chunk, a row's pages and two pages) instead
    monkeypatch.undo()
    direct = plan_for(config("256M", mode="staged", superbatch=4), dataset, fixed_bytes=1 << 20,
                      batch_nodes=500, batch_edges=1000)
    assert not config("1M").io.direct_io
    assert takes_direct_writes(Path("/var/tmp"))  # ext4 here; a user's tmpfs would not
    assert m.row_bytes <= 4096 and direct.staging_chunk == STAGING_CHUNK
    assert direct.working_bytes == staged.working_bytes - 2 * STAGING_FLUSH + 4 * 4096 + STAGING_CHUNK + 3 * 4096


def test_hybrid_charges_its_partitions_per_superbatch_in_flight_and_splits_the_feature_bytes(dataset):
    m = dataset.manifest
    exact = plan_for(config("64M", superbatch=4, neighbor_cache=0, feature_cache="96K"), dataset,
                     fixed_bytes=1 << 20, batch_nodes=500, batch_edges=1000)
    hybrid = plan_for(config("64M", mode="hybrid", superbatch=4, neighbor_cache=0, feature_cache="96K"), dataset,
                      fixed_bytes=1 << 20, batch_nodes=500, batch_edges=1000)
    assert hybrid.graph_bytes == exact.graph_bytes + m.num_nodes  # the map of a superbatch's distinct nodes
    reader = reader_buffer_bytes(row_bytes=m.row_bytes, chunk_bytes=STAGING_CHUNK_SMALL,
                                 scatter_bytes=STAGING_CHUNK_SMALL)
    assert hybrid.working_bytes == (exact.working_bytes + reader
                                    + SUPERBATCHES_IN_FLIGHT * 4 * HYBRID_BYTES_PER_SAMPLED_NODE * 500)
    feature = 96 << 10
    assert hybrid.resident_bytes == int(feature * HYBRID_RESIDENT_SHARE) // SUPERBATCHES_IN_FLIGHT
    assert hybrid.feature_cache_rows == (feature - SUPERBATCHES_IN_FLIGHT * hybrid.resident_bytes) // m.row_bytes
    assert 0 < hybrid.feature_cache_rows < m.num_nodes
    assert hybrid.total == (hybrid.fixed_bytes + hybrid.graph_bytes + hybrid.working_bytes
                            + hybrid.feature_cache_rows * m.row_bytes + SUPERBATCHES_IN_FLIGHT * hybrid.resident_bytes)
    assert hybrid.total <= 64 << 20
    assert "resident partitions 3 x" in hybrid.describe()
    with pytest.raises(UserError, match="too small for mode hybrid"):
        plan_for(config("4M", mode="hybrid", superbatch=512), dataset, fixed_bytes=0, batch_nodes=5000,
                 batch_edges=50000)


class _MappedBytes:
    """Live and peak bytes of the writable mappings the process makes (slots, page-aligned buffers), counted by
    wrapping ``mmap.mmap``: a mapping is memory a plan must charge as much as an array (read-only ones, a client's
    view of the slots, are not the daemon's)."""

    def __init__(self) -> None:
        self.live = self.peak = 0

    def wrap(self) -> type:
        counter = self

        class Counted(mmap.mmap):
            def __new__(cls, fileno: int, *args: object, **kwargs: object) -> "Counted":
                obj = super().__new__(cls, fileno, *args, **kwargs)  # type: ignore[call-overload]
                writable = kwargs.get("prot", mmap.PROT_WRITE) & mmap.PROT_WRITE and \
                    kwargs.get("access") != mmap.ACCESS_READ
                # anonymous memory and memfds; a map of a dataset file is page cache the kernel may take back
                memory = fileno == -1 or os.readlink(f"/proc/self/fd/{fileno}").startswith("/memfd:")
                obj._counted = len(obj) if writable and memory else 0
                counter.live += obj._counted
                counter.peak = max(counter.peak, counter.live)
                return obj

            def close(self) -> None:
                super().close()  # raises while views are alive: then the mapping stays, and its charge
                counter.live -= self._counted
                self._counted = 0

            def __del__(self) -> None:
                counter.live -= self._counted
                self._counted = 0

        return Counted


@pytest.mark.slow
def test_staged_holds_no_more_than_its_plan_on_a_graph_that_fills_it(tmp_path_factory, monkeypatch):
    """Mode staged on a 100k-node graph with a budget its parts fill (windows of a few batches, all lists and a
    feature cache of a third of the rows): the arrays it allocates (tracemalloc, which numpy reports to) plus the
    writable mappings it makes (slots, the stager's, spill's and neighbour reader's buffers), each at its peak
    over startup and one epoch, stay within the plan's total. Numba's compiled kernels are warmed by a first run,
    so the traced run sees no compiler; what numba kernels allocate inside themselves is not traced."""
    import tracemalloc

    from tests.daemon_harness import daemon_config, running_daemon

    root = tmp_path_factory.mktemp("staged-memory")
    data = small_dataset(root, nodes=100_000, feat_dim=64)
    (root / "staging").mkdir()

    # a superbatch's uncached rows exceed the plan's charge: staged in windows of 8 batches, 4 a superbatch
    monkeypatch.setattr(outofcore, "STAGED_PLAN_BATCHES", 8)

    def run(counted: bool) -> tuple[int, int, int, int]:
        config = daemon_config(data, root / "s.sock", loader={"mode": "staged"}, memory={"budget": "64M"},
                               fullgraph={"superbatch": 32, "sample_group": 4, "staging_dir": str(root / "staging")},
                               sampler={"batch_size": 256, "fanouts": [10, 5], "eval_batch_size": 256},
                               publisher={"slots": 2}, server={"max_clients": 1, "socket": str(root / "s.sock")},
                               io={"direct_io": True})
        mapped = _MappedBytes()
        if counted:
            monkeypatch.setattr(mmap, "mmap", mapped.wrap())
            tracemalloc.start()
        try:
            with running_daemon(config) as daemon:
                client = ControlClient.connect(str(config.server.socket), client="test", timeout=60)
                client.send(Credit(count=client.welcome.slots.count))
                client.send(StartEpoch(epoch=0))
                batches = 0
                while not isinstance(msg := client.recv(timeout=120), EpochEnd):
                    assert isinstance(msg, BatchReady), msg
                    batches += 1
                    client.send(Release(slot=msg.slot, seq=msg.seq))
                client.close()
                plan = daemon.mode.budget_plan
                assert isinstance(plan, outofcore.OutOfCoreBudget)
            traced = tracemalloc.get_traced_memory()[1] if counted else 0
        finally:
            if counted:
                tracemalloc.stop()
                monkeypatch.setattr(mmap, "mmap", real_mmap)
        return plan.total, traced, mapped.peak, batches

    real_mmap = mmap.mmap
    run(counted=False)  # numba compiles here, outside the measurement
    total, traced, mapped, batches = run(counted=True)
    assert batches > 2 * 32  # the epoch spans superbatches
    held = traced + mapped
    # the caches take what the budget leaves, so everything planned is allocated: the count sees all of it
    assert held >= 0.75 * total, (held, total)
    # the pipeline's Python objects (futures, messages, log records) and allocator rounding: 1 MiB
    assert held <= total + (1 << 20), f"held {held:,} B (arrays {traced:,}, mappings {mapped:,}), plan {total:,} B"
