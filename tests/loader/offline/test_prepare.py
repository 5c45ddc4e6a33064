"""prepare: the partitioned dataset holds exactly the input graph, in partition-contiguous order."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.format.dataset import FEATURE_ALIGNMENT, open_dataset
from loader.format.manifest_tables import SplitSizes
from loader.format.npyio import read_npy
from loader.offline.prepare import NODE_STATE_BYTES, PrepareOptions, prepare_dataset
from proto.errors import UserError
from tests.graphs import random_graph, shared_graph, write_raw


def read_features(dataset) -> np.ndarray:
    """All feature rows in new-id order, read partition by partition from features.bin."""
    m = dataset.manifest
    data = dataset.file("features").read_bytes()
    rows = [np.frombuffer(data[off:off + nb], dtype=m.feat_dtype.value).reshape(-1, m.feat_dim)
            for off, nb in zip(dataset.partitions().feat_offset.tolist(), dataset.partitions().feat_nbytes.tolist())]
    return np.concatenate(rows)


def assert_round_trip(dataset, src, dst, features, labels, split=None) -> None:
    """Neighbours, features, labels and splits equal the input mapped through the renumbering."""
    m = dataset.manifest
    n = m.num_nodes
    new_to_orig = read_npy(dataset.file("new_to_orig"))
    orig_to_new = np.empty(n, dtype=np.int64)
    orig_to_new[new_to_orig] = np.arange(n)
    indptr = read_npy(dataset.file("indptr"))
    indices = read_npy(dataset.file("indices")).astype(np.int64)
    got = np.repeat(np.arange(n), np.diff(indptr)) * n + indices
    expected = np.sort(orig_to_new[dst] * n + orig_to_new[src])
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(read_features(dataset), features[new_to_orig].astype(m.feat_dtype.value))
    np.testing.assert_array_equal(read_npy(dataset.file("labels")), labels[new_to_orig])
    if split is not None:
        for name, ids in zip(("train", "val", "test"), split):
            np.testing.assert_array_equal(read_npy(dataset.file(name)), np.sort(orig_to_new[ids]))
    parts = dataset.partitions()
    assert (parts.feat_offset % FEATURE_ALIGNMENT == 0).all()
    np.testing.assert_array_equal(parts.edge_begin, indptr[parts.node_begin])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 300), avg=st.integers(0, 8), d=st.integers(1, 9), parts=st.integers(1, 12),
       partitioner=st.sampled_from(["metis", "stream", "random"]), static=st.sampled_from([0.0, 0.01, 0.2]),
       seed=st.integers(0, 2**31))
def test_round_trip_random_graphs(tmp_path_factory, n, avg, d, parts, partitioner, static, seed):
    rng = np.random.default_rng(seed)
    src, dst, features, labels = random_graph(rng, n, n * avg, d)
    perm = rng.permutation(n)
    split = (np.sort(perm[: n // 2]), np.sort(perm[n // 2: 3 * n // 4]), np.sort(perm[3 * n // 4: 9 * n // 10]))
    labels[perm[9 * n // 10:]] = -1  # unlabeled nodes outside every split
    tmp = tmp_path_factory.mktemp("rt")
    write_raw(tmp / "raw", src, dst, features, labels, 3, split)
    parts = min(parts, n)
    budget = NODE_STATE_BYTES * n + (16 << 20)
    dataset = prepare_dataset(tmp / "raw", tmp / "ds", PrepareOptions(
        num_partitions=parts, partitioner=partitioner, memory_budget=budget, static_ratio=static,
        progress=False))
    assert_round_trip(dataset, src, dst, features, labels, split)
    assert dataset.manifest.num_partitions == parts


def test_small_budget_forces_many_buckets_and_stays_exact(tmp_path, monkeypatch):
    """Tiny sort and feature buckets exercise the multi-bucket paths of the external algorithms."""
    import loader.offline.extsort as extsort
    import loader.offline.layout as layout
    import loader.offline.prepare as prepare

    monkeypatch.setattr(extsort, "SORT_BYTES_PER_EDGE", 1 << 24)  # ~64 edges per sort bucket
    original = layout.rows_per_chunk
    chunk_rows: list[int] = []

    def small_chunks(row: int, budget: int, minimum: int = 1) -> int:
        chunk_rows.append(original(row, budget, 1) // 500000 + 7)
        return chunk_rows[-1]

    monkeypatch.setattr(layout, "rows_per_chunk", small_chunks)
    buckets: list[int] = []
    real_sort = prepare.external_sort_edges

    def counted_sort(*args, **kwargs):
        for bucket in real_sort(*args, **kwargs):
            buckets.append(len(bucket.primary))
            yield bucket

    monkeypatch.setattr(prepare, "external_sort_edges", counted_sort)
    rng = np.random.default_rng(3)
    src, dst, features, labels = random_graph(rng, 500, 3000, 5)
    write_raw(tmp_path / "raw", src, dst, features, labels, 3)
    dataset = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(
        num_partitions=7, partitioner="metis", progress=False))
    assert_round_trip(dataset, src, dst, features, labels)
    assert len(buckets) >= 10, buckets  # the sort really ran in many buckets
    assert chunk_rows and max(chunk_rows) < 500  # and the feature layout in several chunks of rows


def test_float16_storage_and_static_cache_contents(tmp_path):
    rng = np.random.default_rng(1)
    src, dst, features, labels = random_graph(rng, 400, 4000, 6)
    write_raw(tmp_path / "raw", src, dst, features, labels, 3)
    dataset = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(
        num_partitions=4, feat_dtype="float16", static_ratio=0.05, progress=False))
    assert dataset.manifest.feat_dtype.value == "float16"
    assert_round_trip(dataset, src, dst, features, labels)
    static = read_npy(dataset.file("static_nodes"))
    assert len(static) == 20
    indptr = read_npy(dataset.file("indptr"))
    indices = read_npy(dataset.file("indices"))
    degree = np.diff(indptr) + np.bincount(indices, minlength=400)
    assert degree[static].min() >= np.sort(degree)[-20]
    np.testing.assert_array_equal(read_npy(dataset.file("static_features")), read_features(dataset)[static])
    static_indptr = read_npy(dataset.file("static_indptr"))
    static_indices = read_npy(dataset.file("static_indices"))
    for k, v in enumerate(static.tolist()):
        np.testing.assert_array_equal(static_indices[static_indptr[k]:static_indptr[k + 1]],
                                      indices[indptr[v]:indptr[v + 1]])


def test_neighbor_rank_orders_by_out_in_ratio(tmp_path):
    rng = np.random.default_rng(2)
    src, dst, features, labels = random_graph(rng, 300, 2000, 2)
    write_raw(tmp_path / "raw", src, dst, features, labels, 3)
    dataset = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(num_partitions=3, progress=False))
    indptr = read_npy(dataset.file("indptr"))
    in_deg = np.diff(indptr)
    out_deg = np.bincount(read_npy(dataset.file("indices")), minlength=300)
    rank = read_npy(dataset.file("neighbor_rank"))
    ratio = np.where(in_deg > 0, out_deg / np.maximum(in_deg, 1), np.inf)[rank]
    assert (np.diff(ratio) <= 0).all()
    assert sorted(rank.tolist()) == list(range(300))


def test_no_split_gets_a_stratified_one(tmp_path):
    rng = np.random.default_rng(4)
    src, dst, features, _ = random_graph(rng, 200, 500, 2)
    labels = np.arange(200) % 4
    write_raw(tmp_path / "raw", src, dst, features, labels, 4)
    dataset = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(num_partitions=2, progress=False))
    m = dataset.manifest
    assert m.splits == SplitSizes(train=120, val=40, test=40, generated=True)


def test_metis_cut_far_below_random_and_stream_reported(tmp_path):
    """coauthor-physics: METIS cuts far fewer edges than random; streaming lands well below random."""
    z = np.load(shared_graph("coauthor-physics.npz"))
    indptr, indices, labels = z["adj_indptr"], z["adj_indices"], z["labels"]
    n = len(indptr) - 1
    src = np.repeat(np.arange(n), np.diff(indptr))
    write_raw(tmp_path / "raw", src, indices.astype(np.int64), np.zeros((n, 1), np.float32), labels,
              int(labels.max()) + 1)
    cut = {}
    for name in ("metis", "stream", "random"):
        dataset = prepare_dataset(tmp_path / "raw", tmp_path / name, PrepareOptions(
            num_partitions=64, partitioner=name, progress=False))
        cut[name] = dataset.manifest.edge_cut.fraction
    assert cut["random"] > 0.95
    assert cut["metis"] < 0.5 * cut["random"]
    assert cut["stream"] < 0.7 * cut["random"]
    assert cut["metis"] < cut["stream"]


def test_refusals_name_the_problem(tmp_path):
    rng = np.random.default_rng(5)
    write_raw(tmp_path / "raw", *random_graph(rng, 50, 100, 2), 3)
    with pytest.raises(UserError, match="exceeds the 50 nodes"):
        prepare_dataset(tmp_path / "raw", tmp_path / "a", PrepareOptions(num_partitions=51, progress=False))
    with pytest.raises(UserError, match="too small"):
        prepare_dataset(tmp_path / "raw", tmp_path / "b", PrepareOptions(num_partitions=2, memory_budget=1 << 20,
                                                                         progress=False))
    with pytest.raises(UserError, match="--partitions"):
        PrepareOptions(num_partitions=0)
    with pytest.raises(UserError, match="static-ratio"):
        PrepareOptions(num_partitions=2, static_ratio=1.5)
    (tmp_path / "exists").mkdir()
    with pytest.raises(UserError, match="already exists"):
        prepare_dataset(tmp_path / "raw", tmp_path / "exists", PrepareOptions(num_partitions=2, progress=False))


def test_metis_over_budget_suggests_stream(tmp_path, monkeypatch):
    from loader.offline.partition import MetisPartitioner

    rng = np.random.default_rng(6)
    write_raw(tmp_path / "raw", *random_graph(rng, 100, 1000, 2), 3)
    monkeypatch.setattr(MetisPartitioner, "MEMORY_FACTOR", 10**6)
    with pytest.raises(UserError, match="use --partitioner stream"):
        prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(num_partitions=4, progress=False))
    assert not (tmp_path / "ds").exists()


def test_dataset_opens_with_checksummed_manifest(tmp_path):
    rng = np.random.default_rng(7)
    write_raw(tmp_path / "raw", *random_graph(rng, 60, 200, 3), 3)
    prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(num_partitions=3, progress=False))
    m = open_dataset(tmp_path / "ds").manifest
    assert m.num_nodes == 60 and m.num_edges == 200 and m.index_dtype.value == "int32"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "raw"]


def test_prepare_picks_many_small_partitions_by_default(tmp_path):
    from loader.format.partition_count import auto_partitions

    src, dst, features, labels = random_graph(np.random.default_rng(5), 1_000, 5_000, 8)
    write_raw(tmp_path / "raw", src, dst, features, labels, 3)
    dataset = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(progress=False))
    assert dataset.manifest.num_partitions == auto_partitions(1_000, features.nbytes) == 1_000 // 16


def test_uint8_codes_round_trip_within_half_a_step_and_verify(tmp_path):
    from loader.offline.verify import verify_dataset
    from loader.sampling.inmemory import load_in_memory

    rng = np.random.default_rng(3)
    src, dst, features, labels = random_graph(rng, 400, 4000, 6)
    features[:, 5] = (features[:, 5] > 0).astype(np.float32)  # a 0/1 column: exact
    write_raw(tmp_path / "raw", src, dst, features, labels, 3)
    dataset = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(
        num_partitions=4, feat_dtype="uint8", static_ratio=0.05, memory_budget=64 << 20, progress=False))
    m = dataset.manifest
    assert m.feat_dtype.value == "uint8" and m.row_bytes == 6 and m.value_dtype == np.float32
    assert m.version == "1.4"  # a 1.3 reader refuses the dtype in one line
    assert "feature_range.npy" in m.files  # checksummed like every file
    codec = dataset.feature_codec()
    assert codec is not None
    np.testing.assert_array_equal(codec.low, features.min(axis=0))
    np.testing.assert_array_equal(codec.high, features.max(axis=0))
    new_to_orig = read_npy(dataset.file("new_to_orig"))
    values = codec.decode(read_features(dataset))
    assert (np.abs(values - features[new_to_orig]) <= codec.max_error * 1.01 + 1e-6).all()
    np.testing.assert_array_equal(values[:, 5], features[new_to_orig, 5])
    static = read_npy(dataset.file("static_nodes"))
    np.testing.assert_array_equal(read_npy(dataset.file("static_features")), read_features(dataset)[static])
    # the in-memory reference decodes them too, and verify checks the range file like any other
    graph = load_in_memory(dataset)
    np.testing.assert_array_equal(graph.feature_rows(np.arange(10)), values[:10])
    assert verify_dataset(dataset.path, progress=False).problems == []
    (dataset.path / "feature_range.npy").write_bytes((dataset.path / "feature_range.npy").read_bytes()[:-4] + b"\0" * 4)
    assert any("feature_range.npy" in p for p in verify_dataset(dataset.path, progress=False).problems)


def test_uint8_codes_refuse_non_finite_features(tmp_path):
    rng = np.random.default_rng(4)
    src, dst, features, labels = random_graph(rng, 100, 400, 3)
    features[7, 1] = np.inf
    write_raw(tmp_path / "raw", src, dst, features, labels, 3)
    with pytest.raises(UserError):
        prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(num_partitions=2, feat_dtype="uint8",
                                                                          progress=False))
    assert not (tmp_path / "ds").exists()
