"""BatchGNN's aggregation cache (``megabatch aggregate``): the kernel against a plain recomputation for every
aggregator (property test), the built file in features.bin's layout, its publication in the manifest, the cost
model."""

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.format.aggregates import SECTION, aggregation_bytes, aggregation_files, node_row_starts
from loader.format.dataset import open_dataset
from loader.offline.aggregation import KINDS, build_aggregation_cache
from loader.offline.aggregation_kernels import KIND_CODES, aggregate_chunk, half_to_float, kernel_features
from loader.offline.verify import verify_dataset
from proto.errors import UserError


def reference(kind, in_neighbours, rows):
    """Plain Python, float64: per node the aggregate of its in-neighbours' rows."""
    out = []
    degree = [len(nb) for nb in in_neighbours]
    for v, nb in enumerate(in_neighbours):
        acc = [0.0] * len(rows[0])
        for u in nb:
            w = 1 / math.sqrt((degree[u] + 1) * (degree[v] + 1)) if kind == "gcn" else 1.0
            acc = [a + w * float(x) for a, x in zip(acc, rows[u], strict=True)]
        if kind == "mean" and nb:
            acc = [a / len(nb) for a in acc]
        if kind == "gcn":
            acc = [a + float(x) / (degree[v] + 1) for a, x in zip(acc, rows[v], strict=True)]
        out.append(acc)
    return np.array(out)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 30), st.integers(1, 6), st.sampled_from(KINDS), st.sampled_from(["float32", "float16"]),
       st.integers(0, 2**31 - 1), st.integers(1, 30))
def test_the_kernel_equals_a_plain_recomputation(n, dim, kind, dtype, seed, chunk):
    rng = np.random.default_rng(seed)
    in_neighbours = [sorted(rng.integers(0, n, rng.integers(0, 6)).tolist()) for _ in range(n)]  # repeats allowed
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(nb) for nb in in_neighbours], out=indptr[1:])
    indices = np.array([u for nb in in_neighbours for u in nb], dtype=np.int32)
    # rows scattered in a flat array with gaps, as partitions at aligned offsets are
    row_start = np.cumsum(rng.integers(dim, 3 * dim, n)) - dim
    flat = rng.standard_normal(int(row_start[-1]) + dim).astype(dtype)
    rows = [flat[s:s + dim] for s in row_start]
    want = reference(kind, in_neighbours, rows)
    got = np.zeros((n, dim), dtype=np.float32)
    for begin in range(0, n, chunk):  # chunked as the builder does: each chunk sees only its own edges
        end = min(n, begin + chunk)
        out = np.zeros((end - begin, dim), dtype=np.float32)
        features, half = kernel_features(flat)
        aggregate_chunk(indptr, indices[indptr[begin]:indptr[end]], int(indptr[begin]), begin, end, features,
                        row_start.astype(np.int64), dim, np.diff(indptr), KIND_CODES[kind], out, half)
        got[begin:end] = out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_half_to_float_widens_every_float16_bit_pattern_as_numpy_does():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    got = np.array([half_to_float(b) for b in bits], dtype=np.float32)
    assert np.array_equal(got, want, equal_nan=True)


@pytest.fixture
def own_dataset(dataset_3k, tmp_path):
    copy = tmp_path / "dataset"
    shutil.copytree(dataset_3k, copy)  # the shared fixture must stay as it is
    return copy


def dense_features(dataset):
    m = dataset.manifest
    flat = np.fromfile(dataset.file("features"), dtype=m.feat_dtype.value)
    starts = node_row_starts(dataset)
    return np.stack([flat[s:s + m.feat_dim] for s in starts])


@pytest.mark.parametrize("kind", KINDS)
def test_the_built_cache_is_the_aggregate_in_features_layout_and_is_published(own_dataset, kind):
    cache = build_aggregation_cache(own_dataset, kind, 100_000)  # chunks of ~200 rows: 14 of them
    dataset = open_dataset(own_dataset)
    assert dataset.manifest.extra[SECTION] == cache.to_json() and cache.kind == kind
    x = dense_features(dataset)
    indptr = dataset.read("indptr", np.int64, 1)
    indices = np.load(dataset.file("indices"))
    in_neighbours = [indices[indptr[v]:indptr[v + 1]].tolist() for v in range(len(indptr) - 1)]
    want = reference(kind, in_neighbours, x)
    flat = np.fromfile(dataset.path / cache.file, dtype=dataset.manifest.feat_dtype.value)
    got = np.stack([flat[s:s + dataset.manifest.feat_dim] for s in node_row_starts(dataset)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (dataset.path / cache.file).stat().st_size == dataset.file("features").stat().st_size
    report = verify_dataset(dataset.path)  # the new files' checksums are in the manifest and hold
    assert report.ok, report.problems


def test_another_kind_replaces_the_cache_and_its_files(own_dataset):
    build_aggregation_cache(own_dataset, "sum", 1 << 20)
    build_aggregation_cache(own_dataset, "mean", 1 << 20)
    dataset = open_dataset(own_dataset)
    assert dataset.manifest.extra[SECTION]["kind"] == "mean"
    for name in aggregation_files("sum"):
        assert not (own_dataset / name).exists() and name not in dataset.manifest.files
    for name in aggregation_files("mean"):
        assert name in dataset.manifest.files
    assert verify_dataset(dataset.path).ok


def test_bad_input_is_one_line_and_leaves_the_dataset_as_it_was(own_dataset):
    before = (own_dataset / "manifest.json").read_bytes()
    with pytest.raises(UserError, match="--kind must be one of"):
        build_aggregation_cache(own_dataset, "max", 1 << 20)
    with pytest.raises(UserError, match="--memory-budget .* too small"):
        build_aggregation_cache(own_dataset, "mean", 1 << 10)
    assert (own_dataset / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in own_dataset.iterdir() if "aggregat" in p.name) == []
    done = subprocess.run([sys.executable, "-m", "loader.cli", "aggregate", str(own_dataset), "--kind", "max"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_cli_builds_the_cache_and_reports_what_it_saves(own_dataset):
    done = subprocess.run([sys.executable, "-m", "loader.cli", "aggregate", str(own_dataset), "--kind", "gcn",
                           "--memory-budget", "64M", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kind"] == "gcn" and report["bytes_per_batch_without"] > 0 and report["bytes_per_batch_with"] > 0
    assert report["pays"] == (report["bytes_per_batch_with"] < report["bytes_per_batch_without"])
    shown = subprocess.run([sys.executable, "-m", "loader.cli", "inspect", str(own_dataset), "--json"],
                           capture_output=True, text=True)
    assert json.loads(shown.stdout)["aggregation_cache"]["kind"] == "gcn"


def test_the_cost_model_counts_two_rows_per_inner_node_and_none_of_the_last_hop():
    assert aggregation_bytes([1024, 9000, 30000], 100) == (40024 * 100, 2 * 10024 * 100)
    without, with_cache = aggregation_bytes([100, 900, 500], 4)  # a thin last hop: the cache fetches more
    assert with_cache > without


def test_sage_on_a_mean_cache_is_sage_over_every_neighbour(own_dataset):
    """With every neighbour sampled, layer 1 over the sampled last hop and layer 1 from the mean cache compute the
    same thing: the batches (one hop fewer) and the logits agree, whole and cut into micro-batches."""
    import torch

    from trainer.inmemory_source import InMemorySource
    from trainer.micro_batches import split_batch
    from trainer.models import build_model

    build_aggregation_cache(own_dataset, "mean", 1 << 20)
    full = InMemorySource(own_dataset, batch_size=64, fanouts=(-1, -1), seed=2)
    cached = InMemorySource(own_dataset, batch_size=64, fanouts=(-1, -1), seed=2, aggregation=True)
    assert cached.info.aggregation == "mean" and cached.info.num_hops == 2
    torch.manual_seed(0)
    model = build_model("sage", 16, 32, 4, 2, dropout=0.0, aggregation="mean").eval()
    for want_batch, got_batch, _ in zip(full.train_batches(0), cached.train_batches(0), range(3)):
        assert len(got_batch.num_sampled_edges) == 1 and got_batch.x_agg is not None
        assert torch.equal(got_batch.n_id[:64], want_batch.n_id[:64])
        with torch.no_grad():
            want = model(want_batch.x, want_batch.edge_index, want_batch.num_sampled_nodes,
                         want_batch.num_sampled_edges)
            got = model(got_batch.x, got_batch.edge_index, got_batch.num_sampled_nodes, got_batch.num_sampled_edges,
                        got_batch.x_agg)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            parts = split_batch(got_batch, torch.arange(got_batch.batch_size) % 3)
            for part in parts:
                b = part.batch
                out = model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges, b.x_agg)
                torch.testing.assert_close(out, got[part.seeds], rtol=1e-5, atol=1e-5)
    # evaluation may sample every hop instead, with the same model
    plain_eval = InMemorySource(own_dataset, fanouts=(5, 5), seed=2, aggregation=True, eval_aggregation=False)
    batch = next(iter(plain_eval.eval_batches("val")))
    assert batch.x_agg is None and len(batch.num_sampled_edges) == 2


def test_training_with_the_cache_and_its_refusals(own_dataset):
    from trainer.inmemory_source import InMemorySource
    from trainer.loop import TrainConfig, train

    with pytest.raises(UserError, match="has no aggregation cache: build one with 'megabatch aggregate"):
        InMemorySource(own_dataset, aggregation=True)
    build_aggregation_cache(own_dataset, "gcn", 1 << 20)
    source = InMemorySource(own_dataset, batch_size=256, fanouts=(10, 5), seed=0, aggregation=True)
    result = train(source, TrainConfig(model="gcn", hidden=32, epochs=2, device="cpu"), log=lambda line: None)
    assert len(result.epochs) == 2 and result.test_acc_at_best is not None
    for model, message in (("sage", "reads a 'mean' one"), ("gat", "reads none")):
        with pytest.raises(UserError, match=message):
            train(source, TrainConfig(model=model, hidden=32, epochs=1, device="cpu"))
    done = subprocess.run([sys.executable, "-m", "trainer", "--socket", "/nonexistent.sock", "--aggregation-cache"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "inmemory-mode option" in done.stderr and len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("where", ["a row", "the end"])
def test_a_changed_or_cut_cache_file_is_refused_when_read_whole(own_dataset, where):
    from loader.format.aggregates import read_aggregates

    cache = build_aggregation_cache(own_dataset, "mean", 1 << 20)
    path = own_dataset / cache.file
    data = bytearray(path.read_bytes())
    if where == "a row":
        data[len(data) // 3] ^= 0x01
    else:
        data = data[:-4096]
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="aggregates-mean.bin: (not the file the manifest records|truncated)"):
        read_aggregates(open_dataset(own_dataset))


def test_a_dataset_of_feature_codes_is_refused_in_one_line(tmp_path):
    from tests.daemon_harness import small_dataset

    path = small_dataset(tmp_path, nodes=300, partitions=2, feat_dtype="uint8")
    before = sorted(p.name for p in path.iterdir())
    with pytest.raises(UserError, match="8-bit codes \\(uint8\\) cannot be aggregated"):
        build_aggregation_cache(path, "mean", 1 << 20)
    assert sorted(p.name for p in path.iterdir()) == before
