"""Features held sparse (trainer/sparse_features.py): the CSR against numpy, a batch's rows against the dense
ones, layer 0 the same from either, and a link run that trains bit for bit as from dense rows."""

import json
import shutil
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from loader.format.dataset import open_dataset
from loader.format.read_checks import CorruptData
from loader.offline.prepare import PrepareOptions, prepare_dataset
from loader.sampling.inmemory import load_in_memory
from proto.errors import UserError
from tests.graphs import link_input_graph, link_raw
from tests.trainer.test_link_train import without_timings
from trainer.__main__ import main
from trainer.inmemory_source import load_held
from trainer.models import SampledGNN, build_model
from trainer.sparse_features import sparse_feature_ranges, sparse_features
from trainer.sparse_input import sparse_rows

_ELEMENTS = st.sampled_from([0.0, 0.0, 0.0, 0.0, -0.0, 1.0, -2.5, 3.0, np.nan])
_MATRICES = hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=12),
                       elements=_ELEMENTS)


@settings(max_examples=200, deadline=None)
@given(x=_MATRICES, chunk=st.integers(1, 5), data=st.data())
def test_held_rows_are_the_dense_rows(x, chunk, data):
    held = sparse_features(x, max_density=1.0, chunk_rows=chunk)
    assert held is not None
    rows, cols = np.nonzero(x)  # NaN is a non-zero, -0.0 is not
    np.testing.assert_array_equal(held.indices, cols)
    np.testing.assert_array_equal(held.values, x[rows, cols])
    np.testing.assert_array_equal(held.indptr, np.concatenate([[0], np.cumsum(np.count_nonzero(x, axis=1))]))
    nodes = np.asarray(data.draw(st.lists(st.integers(0, x.shape[0] - 1), max_size=20)), np.int64)
    batch = held.rows(nodes)
    assert batch.layout == torch.sparse_csr and tuple(batch.shape) == (nodes.size, x.shape[1])
    want = np.where(x[nodes] == 0, np.float32(0), x[nodes])  # held rows bring back -0.0 as 0.0
    np.testing.assert_array_equal(batch.to_dense().numpy(), want)
    # layer 0 takes the held rows or leaves them by the rule it applies to dense ones: the same rows or none
    budget = data.draw(st.integers(0, max(1, x.size)))
    got, ref = sparse_rows(batch, budget), sparse_rows(torch.from_numpy(want), budget)
    assert (got is None) == (ref is None)
    if got is not None and ref is not None:
        for mine, reference in zip((got.indptr, got.indices, got.values), (ref.indptr, ref.indices, ref.values),
                                   strict=True):
            np.testing.assert_array_equal(mine, reference)


def test_only_sparse_float32_features_are_held():
    x = np.zeros((100, 10), np.float32)
    x[:, 0] = 1.0  # 10% non-zero
    assert sparse_features(x, max_density=0.05) is None
    held = sparse_features(x, max_density=0.1, chunk_rows=7)
    assert held is not None and held.density == pytest.approx(0.1)
    assert sparse_features(x.astype(np.float16), max_density=1.0) is None  # widened per batch instead
    assert sparse_features(np.zeros((0, 10), np.float32)) is None


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("width", [16, 2000], ids=["dense-path", "sparse-path"])
def test_models_give_the_same_output_and_gradients_from_held_rows(kind, width):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, width)).astype(np.float32)
    x[rng.random(x.shape) < 0.99] = 0.0
    held = sparse_features(x, max_density=1.0)
    assert held is not None
    nodes = rng.integers(0, 40, 30)
    # PyG's hop layout: 4 seeds, 8 then 18 sampled nodes; hop 1's 20 edges into the seeds, hop 2's 40 into hop 1
    hop1 = np.stack([rng.integers(0, 12, 20), rng.integers(0, 4, 20)])
    hop2 = np.stack([rng.integers(0, 30, 40), rng.integers(0, 12, 40)])
    edge_index = torch.from_numpy(np.concatenate([hop1, hop2], axis=1))
    outputs = []
    for rows in (held.rows(nodes), torch.from_numpy(x[nodes])):
        torch.manual_seed(0)
        model = build_model(kind, width, 8, 3, 2, 0.0)
        with mock.patch.object(model, "sparse_input_layer", wraps=model.sparse_input_layer) as sparse_path:
            out = model(rows, edge_index, [4, 8, 18], [20, 40])
        # layer 0's rule: 12 targets x 2,000 columns pay for the non-zeros of 30 rows, 12 x 16 do not (nor GAT)
        assert sparse_path.called == (width == 2000 and kind != "gat")
        out.sum().backward()
        outputs.append((out.detach(), [p.grad for p in model.parameters()]))
    (got, got_grads), (want, want_grads) = outputs
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads, strict=True))


@pytest.fixture(scope="module")
def sparse_link_dataset(tmp_path_factory):
    """300 nodes, 2,000 features about 1% non-zero (bag-of-words-like: layer 0 takes the sparse path on SAGE and
    GCN batches), 4 partitions."""
    root = tmp_path_factory.mktemp("sparse-link")
    src, dst = link_input_graph(5, 300, 1200, symmetric=True)
    raw = link_raw(root / "raw", src, dst, 300, feat_dim=2000, undirected=True, eval_negatives=20,
                   feature_density=0.01)
    prepare_dataset(raw.path, root / "ds", PrepareOptions(num_partitions=4, memory_budget=256 << 20, progress=False))
    return root / "ds"


@settings(max_examples=100, deadline=None)
@given(x=_MATRICES, cuts=st.lists(st.integers(0, 12), max_size=4), chunk=st.integers(1, 5), data=st.data())
def test_held_rows_from_ranges_in_any_order_are_the_whole_matrixs(x, cuts, chunk, data):
    edges = sorted({0, x.shape[0], *(c for c in cuts if c <= x.shape[0])})
    ranges = [(begin, x[begin:end]) for begin, end in zip(edges, edges[1:], strict=False)]
    ranges = data.draw(st.permutations(ranges))
    got = sparse_feature_ranges(ranges, x.shape, max_density=1.0, chunk_rows=chunk)
    want = sparse_features(x, max_density=1.0)
    assert got is not None and want is not None and got.shape == want.shape
    for mine, reference in zip((got.indptr, got.indices, got.values), (want.indptr, want.indices, want.values),
                               strict=True):
        np.testing.assert_array_equal(mine, reference)


def test_ranges_that_do_not_tile_the_rows_are_refused():
    x = np.eye(6, dtype=np.float32)
    with pytest.raises(UserError, match="row 2 is missing"):
        sparse_feature_ranges([(0, x[:2]), (3, x[3:])], x.shape, max_density=1.0)
    with pytest.raises(UserError, match="row 1 is read twice"):
        sparse_feature_ranges([(0, x[:2]), (1, x[1:])], x.shape, max_density=1.0)
    with pytest.raises(UserError, match="cover 4 of 6 rows"):
        sparse_feature_ranges([(0, x[:4])], x.shape, max_density=1.0)


def test_a_dataset_is_held_sparse_without_its_dense_matrix(sparse_link_dataset):
    dataset = open_dataset(sparse_link_dataset)
    data, held = load_held(dataset)
    reference = load_in_memory(dataset)
    assert data.features is None and held is not None and reference.features is not None
    want = sparse_features(reference.features)
    assert want is not None
    for mine, theirs in zip((held.indptr, held.indices, held.values), (want.indptr, want.indices, want.values),
                            strict=True):
        np.testing.assert_array_equal(mine, theirs)
    with pytest.raises(RuntimeError, match="not loaded"):
        data.feature_rows(np.arange(3))
    # too dense to hold at a share of 0.1%: the dense matrix after all, as load_in_memory reads it
    dense, none = load_held(dataset, max_density=0.001)
    assert none is None and dense.features is not None
    np.testing.assert_array_equal(dense.features, reference.features)
    kept, not_held = load_held(dataset, hold_sparse=False)
    assert not_held is None and kept.features is not None


def test_a_corrupt_range_fails_the_held_load_as_the_dense_one(sparse_link_dataset, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(sparse_link_dataset, copy)
    features = copy / "features.bin"
    with features.open("r+b") as f:  # a non-zero where the first row has a zero: the sums must catch it
        f.seek(4)
        word = f.read(4)
        f.seek(4)
        f.write(bytes([word[0] ^ 0x40, *word[1:]]))
    with pytest.raises(CorruptData):
        load_in_memory(open_dataset(copy))
    with pytest.raises(CorruptData):
        load_held(open_dataset(copy))


@pytest.mark.parametrize("options", [("--model", "sage"), ("--model", "gcn", "--link-order", "comet",
                                                          "--buffer-partitions", "2"), ("--model", "gat")],
                         ids=["sage", "gcn-comet", "gat"])
def test_a_link_run_on_held_rows_trains_as_on_dense_rows(sparse_link_dataset, tmp_path, monkeypatch, capsys,
                                                         options):
    args = ["--mode", "inmemory", "--dataset", str(sparse_link_dataset), "--task", "link", "--hidden", "16",
            "--batch-size", "128", "--fanouts", "5,5", "--epochs", "2", "--decoder", "mlp", "-q", "--no-progress",
            *options]
    took_sparse_path = _held_then_dense(lambda out: main([*args, "--json-out", str(out)]), "trainer.link.inmemory",
                                        tmp_path, monkeypatch)
    assert took_sparse_path == (options[1] != "gat")


def _held_then_dense(run, source_module, tmp_path, monkeypatch) -> bool:
    """``run(out)`` (a trainer run writing its JSON to ``out``) with the features held sparse, then with
    ``source_module``'s source holding them dense: the two results must be equal but for their timings and the
    source's description. Whether the first run's layer 0 took the sparse path."""
    held, dense = tmp_path / "held.json", tmp_path / "dense.json"
    with mock.patch("trainer.models.SampledGNN.sparse_input_layer", autospec=True,
                    side_effect=SampledGNN.sparse_input_layer) as sparse_path:
        assert run(held) == 0
    monkeypatch.setattr(f"{source_module}.load_held", lambda dataset, hold_sparse=True: load_held(dataset, False))
    assert run(dense) == 0
    first, second = json.loads(held.read_text()), json.loads(dense.read_text())
    assert "features held sparse" in first["source"] and "held sparse" not in second["source"]
    first.pop("source"), second.pop("source")
    assert without_timings(first) == without_timings(second)
    return sparse_path.called


def test_ranks_train_on_held_rows(sparse_link_dataset, tmp_path):
    # DDP hands the held rows' sparse tensor to the model as any input: two ranks train on it
    out = tmp_path / "ddp.json"
    args = ["--mode", "inmemory", "--dataset", str(sparse_link_dataset), "--task", "link", "--hidden", "16",
            "--batch-size", "64", "--fanouts", "5,5", "--epochs", "3", "--nproc-per-node", "2", "--device", "cpu", "-q",
            "--no-progress", "--json-out", str(out)]
    done = subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert "features held sparse" in result["source"]
    assert result["epochs"][-1]["loss"] < result["epochs"][0]["loss"]


def _node_run(dataset, out, *extra):
    return main(["--mode", "inmemory", "--dataset", str(dataset), "--hidden", "16", "--batch-size", "64", "--fanouts",
                 "5,5", "--epochs", "2", "-q", "--no-progress", "--json-out", str(out), *extra])


@pytest.mark.parametrize("kind", ["sage", "gcn"])
def test_a_node_run_on_held_rows_trains_as_on_dense_rows(sparse_link_dataset, tmp_path, monkeypatch, kind):
    # a link dataset keeps its labels and node split: node classification trains on it too
    assert _held_then_dense(lambda out: _node_run(sparse_link_dataset, out, "--model", kind), "trainer.inmemory_source",
                            tmp_path, monkeypatch)


def test_micro_batches_keep_dense_rows(sparse_link_dataset, tmp_path):
    out = tmp_path / "micro.json"
    assert _node_run(sparse_link_dataset, out, "--micro-batches", "2") == 0
    assert "held sparse" not in json.loads(out.read_text())["source"]
