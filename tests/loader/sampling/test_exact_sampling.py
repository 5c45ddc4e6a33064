"""The exact out-of-core sampler, its neighbour cache and reader: bitwise equal to the in-RAM sampler."""

import errno
import fcntl
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.format.dataset import open_dataset
from loader.format.read_checks import file_block_checksums
from loader.offline.importers import import_dataset
from loader.offline.prepare import PrepareOptions, prepare_dataset
from loader.sampling.exact_sampling import ExactSampler
from loader.sampling.neighbor_cache import NeighborCache
from loader.sampling.neighbor_reader import ALIGNMENT, NeighborReader, staging_bound
from loader.sampling.sampling import CSCGraph, SampledPass, batch_keys, sample_pass
from proto.errors import UserError
from tests.graphs import generated_dataset, shared_graph

FIELDS = ("node_ptr", "nodes", "edge_ptr", "edge_src", "edge_dst", "num_sampled_nodes", "num_sampled_edges")
FANOUTS = ([10, 5], [3, 3, 3], [-1, 2], [0, 4])


class Graph:
    """A graph on disk (an ``indices.npy``) beside its in-RAM copy, the reference's input."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, path: Path, rank: np.ndarray) -> None:
        self.indptr, self.indices, self.path, self.rank = indptr, indices, path, rank
        self.n = len(indptr) - 1
        self.csc = CSCGraph(indptr, indices, np.arange(self.n, dtype=np.int64))
        self.list_bytes = (np.diff(indptr) * indices.itemsize)[rank]

    def budget(self, lists: int) -> int:
        """Table plus the first ``lists`` lists of the ranking: the cache holds exactly those."""
        return 8 * self.n + int(self.list_bytes[:lists].sum())

    def sampler(self, budget: int, group_size: int, **reader_options: object) -> ExactSampler:
        reader = NeighborReader(self.indptr, self.path, **reader_options)  # type: ignore[arg-type]
        return ExactSampler(self.indptr, NeighborCache.build(self.rank, reader, budget), reader,
                            group_size=group_size, owns_reader=True)


def csc(n: int, src: np.ndarray, dst: np.ndarray, dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order].astype(dtype)


def assert_same(got: SampledPass, want: SampledPass) -> None:
    assert (got.num_batches, got.num_hops) == (want.num_batches, want.num_hops)
    for field in FIELDS:
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype and a.shape == b.shape, field
        np.testing.assert_array_equal(a, b, err_msg=field)


def check_pass(graph: Graph, sampler: ExactSampler, seeds: np.ndarray, batch_size: int, fanouts: list[int],
               key_seed: int = 0) -> SampledPass:
    keys = batch_keys(key_seed, 0, 0, 0, 0, -(-len(seeds) // batch_size))
    want = sample_pass(graph.csc, seeds, batch_size, fanouts, keys)
    got = sampler.sample_pass(seeds, batch_size, fanouts, keys)
    assert_same(got, want)
    return want


def lists_fetched(want: SampledPass, indptr: np.ndarray, group_size: int, fanouts: list[int]) -> int:
    """Documented fetch count: distinct non-empty frontier lists per hop (fanout != 0) per group."""
    total = 0
    degrees = np.diff(indptr)
    for first in range(0, want.num_batches, group_size):
        for h in np.flatnonzero(fanouts).tolist():
            frontier = []
            for b in range(first, min(first + group_size, want.num_batches)):
                nodes = want.batch(b).nodes
                counts = want.num_sampled_nodes[b]
                frontier.append(nodes[counts[:h].sum():counts[:h + 1].sum()])
            union = np.unique(np.concatenate(frontier))
            total += int(np.count_nonzero(degrees[union]))
    return total


# ---- a generated prepared dataset ----

@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Graph, np.ndarray]:
    dataset = open_dataset(generated_dataset(tmp_path_factory.mktemp("exact")))
    indptr, indices = dataset.read("indptr"), dataset.read("indices")
    graph = Graph(indptr, indices, dataset.file("indices"), dataset.read("neighbor_rank"))
    seeds = np.random.default_rng(5).permutation(dataset.read("train"))[:700]
    return graph, seeds


@pytest.mark.parametrize("budget", ["zero", "tiny", "half", "all"])
@pytest.mark.parametrize("group_size", [1, 3, 64])
def test_generated_dataset_equals_in_memory(generated: tuple[Graph, np.ndarray], budget: str, group_size: int
                                            ) -> None:
    graph, seeds = generated
    first_nonempty = int(np.argmax(graph.list_bytes > 0))
    lists = {"zero": None, "tiny": first_nonempty + 3, "half": graph.n // 2, "all": graph.n}[budget]
    budget_bytes = 0 if lists is None else graph.budget(lists)
    # Gap and O_DIRECT vary with the group so every read path meets every cache size.
    options: dict[int, dict[str, object]] = {1: {"gap_bytes": 0}, 3: {"direct_io": True},
                                             64: {"gap_bytes": 1 << 16, "block_bytes": 4096}}
    with graph.sampler(budget_bytes, group_size, **options[group_size]) as sampler:
        assert sampler.cache.nbytes <= budget_bytes
        for fanouts in FANOUTS:
            for batch_size in (1, 7, 100):
                count = 40 if batch_size == 1 else len(seeds)
                before = sampler.stats
                want = check_pass(graph, sampler, seeds[:count], batch_size, fanouts)
                after = sampler.stats
                fetched = (after.lists_from_cache - before.lists_from_cache
                           + after.lists_from_disk - before.lists_from_disk)
                assert fetched == lists_fetched(want, graph.indptr, group_size, fanouts)
        stats = sampler.stats
        if budget == "zero":
            assert stats.lists_from_cache == 0 and stats.lists_from_disk > 0 and stats.bytes_read > 0
        if budget == "all":
            assert stats.lists_from_disk == 0 and stats.bytes_read == 0 and stats.read_calls == 0
        if budget in ("tiny", "half"):
            assert stats.lists_from_cache > 0 and stats.lists_from_disk > 0
        assert stats.passes == len(FANOUTS) * 3


def test_from_dataset_owns_its_reader(generated: tuple[Graph, np.ndarray]) -> None:
    graph, seeds = generated
    dataset = open_dataset(graph.path.parent)
    with ExactSampler.from_dataset(dataset, cache_budget_bytes=graph.budget(graph.n // 3), group_size=8) as sampler:
        check_pass(graph, sampler, seeds, 50, [5, 5])
        assert sampler.stats.fetch_seconds > 0 and sampler.stats.compute_seconds > 0
    with pytest.raises(ValueError, match="closed"):
        sampler.reader.read([0])


# ---- coauthor-physics (the real graph structure, one feature column) ----

@pytest.fixture(scope="module")
def physics(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    z = np.load(shared_graph("coauthor-physics.npz"))
    root = tmp_path_factory.mktemp("physics")
    # The 8415 bag-of-words columns would cost a GiB of features that sampling never reads.
    np.savez(root / "structure.npz", adj_data=z["adj_data"], adj_indices=z["adj_indices"],
             adj_indptr=z["adj_indptr"], adj_shape=z["adj_shape"], labels=z["labels"],
             attr_matrix=np.ones((int(z["adj_shape"][0]), 1), dtype=np.float32))
    import_dataset(root / "structure.npz", root / "raw", fmt="npz", memory_budget=256 << 20, progress=False)
    dataset = prepare_dataset(root / "raw", root / "ds", PrepareOptions(num_partitions=8, memory_budget=256 << 20,
                                                                        progress=False))
    indices = dataset.read("indices")
    assert len(indices) == len(z["adj_indices"])
    return Graph(dataset.read("indptr"), indices, dataset.file("indices"), dataset.read("neighbor_rank"))


@pytest.mark.parametrize("lists, group_size, options", [
    (None, 64, {}), (0.5, 3, {"direct_io": True}), (1.0, 16, {"gap_bytes": 0})])
def test_coauthor_physics_equals_in_memory(physics: Graph, lists: float | None, group_size: int,
                                           options: dict[str, object]) -> None:
    budget = 0 if lists is None else physics.budget(int(lists * physics.n))
    seeds = np.random.default_rng(9).permutation(physics.n)[:3000]
    with physics.sampler(budget, group_size, **options) as sampler:
        for fanouts, batch_size in (([10, 5], 100), ([-1, 2], 256), ([3, 3, 3], 7), ([0, 4], 100)):
            check_pass(physics, sampler, seeds, batch_size, fanouts, key_seed=batch_size)


# ---- random graphs: raw indices.npy files ----

@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), avg=st.integers(0, 6), dtype=st.sampled_from([np.int32, np.int64]),
       budget_lists=st.one_of(st.none(), st.integers(0, 40)), group_size=st.integers(1, 5),
       gap=st.sampled_from([0, 8, 4096]), direct=st.booleans(), batch_size=st.integers(1, 9),
       fanouts=st.lists(st.integers(-1, 5), max_size=3), seed=st.integers(0, 2**32 - 1))
def test_random_graphs_equal_in_memory(n: int, avg: int, dtype: type, budget_lists: int | None, group_size: int,
                                       gap: int, direct: bool, batch_size: int, fanouts: list[int],
                                       seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch_size = min(batch_size, n)  # each batch's seeds are distinct
    indptr, indices = csc(n, rng.integers(0, n, n * avg), rng.integers(0, n, n * avg), dtype)
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "indices.npy", indices)
        graph = Graph(indptr, indices, Path(tmp) / "indices.npy", rng.permutation(n))
        budget = 0 if budget_lists is None else graph.budget(min(budget_lists, n))
        seeds = np.concatenate([rng.permutation(n)[:batch_size] for _ in range(rng.integers(0, 5))]
                               + [rng.permutation(n)[:rng.integers(0, batch_size + 1)]]).astype(np.int64)
        with graph.sampler(budget, group_size, gap_bytes=gap, direct_io=direct, block_bytes=4096) as sampler:
            check_pass(graph, sampler, seeds, batch_size, fanouts, key_seed=seed)


# ---- NeighborReader ----

@pytest.fixture(scope="module")
def disk_graph(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    rng = np.random.default_rng(11)
    n = 5000
    degrees = rng.zipf(1.8, n).clip(0, 3000) * rng.integers(0, 2, n)  # heavy tail and many empty lists
    dst = np.repeat(np.arange(n), degrees)
    indptr, indices = csc(n, rng.integers(0, n, len(dst)), dst, np.int32)
    path = tmp_path_factory.mktemp("reader") / "indices.npy"
    np.save(path, indices)
    return Graph(indptr, indices, path, rng.permutation(n))


def expected_lists(graph: Graph, nodes: np.ndarray) -> np.ndarray:
    parts = [graph.indices[graph.indptr[v]:graph.indptr[v + 1]] for v in nodes.tolist()]
    return np.concatenate(parts) if parts else np.empty(0, graph.indices.dtype)


@pytest.mark.parametrize("gap", [0, 1 << 20])
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("block", [4096, 1 << 20])
def test_reader_returns_exactly_the_lists(disk_graph: Graph, gap: int, direct: bool, block: int) -> None:
    rng = np.random.default_rng(gap + block + direct)
    with NeighborReader(disk_graph.indptr, disk_graph.path, gap_bytes=gap, direct_io=direct, block_bytes=block,
                        read_threads=3) as reader:
        for size in (0, 1, 17, 400, disk_graph.n):
            nodes = np.sort(rng.choice(disk_graph.n, size, replace=False))
            before = (reader.bytes_read, reader.list_bytes, reader.lists_read)
            got = reader.read(nodes)
            want = expected_lists(disk_graph, nodes)
            assert got.lists.dtype == np.int32
            np.testing.assert_array_equal(got.lists, want)
            np.testing.assert_array_equal(np.diff(got.offsets), np.diff(disk_graph.indptr)[nodes])
            assert reader.list_bytes - before[1] == want.nbytes
            assert reader.lists_read - before[2] == np.count_nonzero(np.diff(disk_graph.indptr)[nodes])
            assert reader.bytes_read - before[0] >= want.nbytes
            if gap == 0 and not direct:
                assert reader.bytes_read - before[0] == want.nbytes  # no gap bytes without coalescing gaps


@pytest.mark.parametrize("direct", [False, True])
def test_reader_stages_in_rounds_within_its_bound(disk_graph: Graph, direct: bool) -> None:
    # a huge gap coalesces every list (and a checked read widens each to pages): without rounds the staging
    # buffer grows to the whole file; with a 16 KiB cap it stays within the cap plus the longest list's pages
    cap = 4 * ALIGNMENT
    page_sums = file_block_checksums(disk_graph.path)
    rng = np.random.default_rng(5)
    with NeighborReader(disk_graph.indptr, disk_graph.path, gap_bytes=1 << 30, direct_io=direct, staging_cap=cap,
                        read_threads=3, page_sums=page_sums if direct else None) as reader:
        degree = np.diff(disk_graph.indptr)
        assert reader.max_staging_bytes == staging_bound(int(degree.max()), 4, disk_graph.path.stat().st_size, cap)
        assert reader.max_staging_bytes < disk_graph.path.stat().st_size // 2
        for nodes in (np.arange(disk_graph.n), np.sort(rng.choice(disk_graph.n, 700, replace=False)),
                      np.array([int(degree.argmax())])):
            np.testing.assert_array_equal(reader.read(nodes).lists, expected_lists(disk_graph, nodes))
            assert reader.staging_bytes <= reader.max_staging_bytes
        assert reader.staging_bytes >= cap  # the 700 lists with gaps between them went through it


def test_reader_coalesces_adjacent_lists(disk_graph: Graph) -> None:
    with NeighborReader(disk_graph.indptr, disk_graph.path, gap_bytes=0, block_bytes=1 << 30) as reader:
        reader.read(np.arange(disk_graph.n))
        assert reader.read_calls == 1 and reader.bytes_read == disk_graph.indices.nbytes
    # every other node: one read per run of lists adjacent in the file without a gap allowance, one with it
    odd = np.arange(1, disk_graph.n, 2)
    begin, end = disk_graph.indptr[odd], disk_graph.indptr[odd + 1]
    nonempty = end > begin
    begin, end = begin[nonempty], end[nonempty]
    runs = 1 + np.count_nonzero(begin[1:] != end[:-1])
    assert 1 < runs < len(begin)
    with NeighborReader(disk_graph.indptr, disk_graph.path, gap_bytes=0) as reader:
        reader.read(odd)
        assert reader.read_calls == runs
    with NeighborReader(disk_graph.indptr, disk_graph.path, gap_bytes=1 << 30, block_bytes=1 << 30) as reader:
        np.testing.assert_array_equal(reader.read(odd).lists, expected_lists(disk_graph, odd))
        assert reader.read_calls == 1
    with NeighborReader(disk_graph.indptr, disk_graph.path, direct_io=True, gap_bytes=0) as reader:
        reader.read(odd)
        assert reader.read_calls <= runs  # widening to pages only merges ranges


def test_reader_on_a_raw_file_with_offset(tmp_path: Path, disk_graph: Graph) -> None:
    path = tmp_path / "raw.bin"
    path.write_bytes(b"x" * 100 + disk_graph.indices.astype(np.int64).tobytes())
    nodes = np.arange(0, disk_graph.n, 3)
    for direct in (False, True):
        with NeighborReader(disk_graph.indptr, path, dtype=np.int64, data_offset=100, direct_io=direct) as reader:
            got = reader.read(nodes)
            assert got.lists.dtype == np.int64
            np.testing.assert_array_equal(got.lists, expected_lists(disk_graph, nodes))


def test_reader_falls_back_when_o_direct_is_refused(disk_graph: Graph, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    real_open, real_preadv = os.open, os.preadv

    def refusing_open(path: object, flags: int, *args: object) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    def refusing_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    nodes = np.arange(0, disk_graph.n, 7)
    for opener in (refusing_open, real_open):
        monkeypatch.setattr(os, "open", opener)
        monkeypatch.setattr(os, "preadv", refusing_preadv)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="megabatch"), \
                NeighborReader(disk_graph.indptr, disk_graph.path, direct_io=True) as reader:
            assert not reader.direct_io
            np.testing.assert_array_equal(reader.read(nodes).lists, expected_lists(disk_graph, nodes))
        assert "refuses O_DIRECT" in caplog.text


def test_reader_rejects_bad_input(tmp_path: Path, disk_graph: Graph) -> None:
    with NeighborReader(disk_graph.indptr, disk_graph.path) as reader:
        with pytest.raises(ValueError, match="not strictly ascending"):
            reader.read([3, 2])
        with pytest.raises(ValueError, match="not strictly ascending"):
            reader.read([2, 2])
        with pytest.raises(ValueError, match=f"node {disk_graph.n} outside"):
            reader.read([0, disk_graph.n])
        with pytest.raises(ValueError, match="node -1 outside"):
            reader.read([-1])
        with pytest.raises(ValueError, match="out:"):
            reader.read_into([1, 2], np.empty(10**6, dtype=np.int32))
    with pytest.raises(ValueError, match="dtype and data_offset"):
        NeighborReader(disk_graph.indptr, disk_graph.path, dtype=np.int32)
    with pytest.raises(ValueError, match="gap_bytes"):
        NeighborReader(disk_graph.indptr, disk_graph.path, gap_bytes=-1)
    with pytest.raises(ValueError, match="read_threads"):
        NeighborReader(disk_graph.indptr, disk_graph.path, read_threads=0)
    with pytest.raises(ValueError, match="indptr\\[-1\\]"):
        NeighborReader(disk_graph.indptr[:-1], disk_graph.path)
    np.save(tmp_path / "floats.npy", np.zeros(len(disk_graph.indices), dtype=np.float32))
    with pytest.raises(ValueError, match="int32 or int64"):
        NeighborReader(disk_graph.indptr, tmp_path / "floats.npy")
    short = tmp_path / "short.bin"
    short.write_bytes(disk_graph.indices[:-1].tobytes())
    with pytest.raises(UserError, match="truncated"):
        NeighborReader(disk_graph.indptr, short, dtype=np.int32, data_offset=0)
    with pytest.raises(UserError, match="not found"):
        NeighborReader(disk_graph.indptr, tmp_path / "missing.npy")


# ---- NeighborCache ----

@pytest.mark.parametrize("extra", [0, 1, 4000, 40_000, 10**9])
def test_cache_is_the_ranked_prefix_that_fits(disk_graph: Graph, extra: int) -> None:
    budget = 8 * disk_graph.n + extra
    with NeighborReader(disk_graph.indptr, disk_graph.path) as reader:
        cache = NeighborCache.build(disk_graph.rank, reader, budget, chunk_bytes=1000)
        # only the chosen lists are read, never the whole file
        assert reader.list_bytes == cache.lists.nbytes
    assert cache.nbytes <= budget
    assert cache.nbytes == 8 * disk_graph.n + cache.lists.nbytes
    k = cache.num_cached
    cached = np.flatnonzero(cache.address >= 0)
    np.testing.assert_array_equal(cached, np.sort(disk_graph.rank[:k]))
    if k < disk_graph.n:  # filling stopped at the first list that does not fit
        assert cache.nbytes + disk_graph.list_bytes[k] > budget
    for v in disk_graph.rank[:k].tolist():
        np.testing.assert_array_equal(cache.get(v), disk_graph.indices[disk_graph.indptr[v]:disk_graph.indptr[v + 1]])
    uncached = disk_graph.rank[k:k + 50]
    assert all(cache.get(v) is None for v in uncached.tolist())
    np.testing.assert_array_equal(cache.lookup(uncached), -1)


def test_cache_build_unmaps_its_staging_buffer(disk_graph: Graph) -> None:
    # a huge gap merges every list into a few ranges read through the staging buffer
    with NeighborReader(disk_graph.indptr, disk_graph.path, gap_bytes=10**9) as reader:
        reader.read(np.arange(0, disk_graph.n, 2))
        assert reader.staging_bytes > disk_graph.list_bytes.sum() // 2
        NeighborCache.build(disk_graph.rank, reader, 10**9)
        assert reader.staging_bytes <= ALIGNMENT


def test_cache_budgets_nest_and_small_budgets_are_empty(disk_graph: Graph) -> None:
    with NeighborReader(disk_graph.indptr, disk_graph.path) as reader:
        caches = [NeighborCache.build(disk_graph.rank, reader, b)
                  for b in (0, 8 * disk_graph.n - 1, 8 * disk_graph.n, 8 * disk_graph.n + 10**4, 10**9)]
    assert caches[0].nbytes == caches[1].nbytes == 0 and caches[0].num_cached == 0
    assert caches[0].get(int(disk_graph.rank[0])) is None
    for small, large in zip(caches, caches[1:]):
        assert small.num_cached <= large.num_cached
        assert set(np.flatnonzero(small.address >= 0)) <= set(np.flatnonzero(large.address >= 0))
    assert caches[-1].num_cached == disk_graph.n
    assert caches[2].num_cached == np.count_nonzero(np.cumsum(disk_graph.list_bytes) == 0)  # the empty lists


def test_cache_rejects_bad_input(disk_graph: Graph) -> None:
    with NeighborReader(disk_graph.indptr, disk_graph.path) as reader:
        with pytest.raises(ValueError, match="budget_bytes"):
            NeighborCache.build(disk_graph.rank, reader, -1)
        with pytest.raises(ValueError, match="neighbor_rank"):
            NeighborCache.build(disk_graph.rank[:-1], reader, 10**9)
        twice = disk_graph.rank.copy()
        twice[1] = twice[0]
        with pytest.raises(ValueError, match="occurs twice"):
            NeighborCache.build(twice, reader, 10**9)


# ---- ExactSampler validation ----

def test_sampler_rejects_bad_input_like_the_in_memory_sampler(disk_graph: Graph, tmp_path: Path) -> None:
    keys = batch_keys(0, 0, 0, 0, 0, 2)
    with disk_graph.sampler(0, 4) as sampler:
        for seeds, size, fanouts, key, message in (
                ([2, 2, 1, 3], 2, [2], keys, "local id 2 occurs twice in batch 0"),
                ([1, 2, 3, 3], 2, [2], keys, "local id 3 occurs twice in batch 1"),
                ([1, disk_graph.n], 2, [2], keys[:1], f"local id {disk_graph.n} outside"),
                ([1, 2], 0, [2], keys, "batch_size"),
                ([1, 2], 2, [-2], keys[:1], "fanouts"),
                ([1, 2], 2, [2], keys, "keys: length 2"),
        ):
            with pytest.raises(ValueError, match=message):
                sampler.sample_pass(np.array(seeds), size, fanouts, key)
            with pytest.raises(ValueError, match=message):
                sample_pass(disk_graph.csc, np.array(seeds), size, fanouts, key)
        # the scratch state survived the failures
        check_pass(disk_graph, sampler, np.arange(0, disk_graph.n, 5), 64, [4, 4])
    with pytest.raises(ValueError, match="group_size"):
        disk_graph.sampler(0, 0)
    with NeighborReader(disk_graph.indptr, disk_graph.path) as reader:
        other = disk_graph.indptr.copy()
        other[1:] = other[-1]
        with pytest.raises(ValueError, match="different indptr"):
            ExactSampler(other, NeighborCache.empty(other), reader)


def test_out_of_range_neighbour_on_disk_is_reported_and_state_kept(tmp_path: Path) -> None:
    indptr = np.array([0, 2, 3, 3], dtype=np.int64)
    np.save(tmp_path / "indices.npy", np.array([1, 9, 0], dtype=np.int32))  # node 0 lists a node 9 of 3
    graph = Graph(indptr, np.array([1, 9, 0], dtype=np.int32), tmp_path / "indices.npy", np.array([2, 1, 0]))
    with graph.sampler(0, 2) as sampler:
        with pytest.raises(ValueError, match="in-neighbour 9 of local node 0 is outside"):
            sampler.sample_pass(np.array([1, 0]), 1, [-1], batch_keys(0, 0, 0, 0, 0, 2))
        check_pass(graph, sampler, np.array([1, 2]), 1, [-1])
