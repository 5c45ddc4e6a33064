"""End to end: each importer and the generator, then prepare; the prepared dataset holds the input graph.

Neighbours of every node, features and labels are compared with the original input, mapped
through the renumbering (``new_to_orig``).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.format.npyio import read_npy
from loader.format.raw import iter_edge_chunks
from loader.offline.generate import generate_graph
from loader.offline.importers import ImportOptions, import_dataset
from loader.offline.prepare import PrepareOptions, prepare_dataset
from tests.graphs import shared_graph
from tests.loader.offline.importers.test_importers import random_graph, write_npz, write_numpy, write_ogb
from tests.loader.offline.test_prepare import assert_round_trip, read_features

E2E = settings(max_examples=20, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@E2E
@given(fmt=st.sampled_from(["npz", "ogb", "numpy"]), seed=st.integers(0, 2**32 - 1), n=st.integers(2, 60),
       e=st.integers(0, 300), d=st.integers(1, 6), with_split=st.booleans(), parts=st.integers(1, 6),
       partitioner=st.sampled_from(["metis", "stream", "random"]))
def test_import_then_prepare_round_trip(tmp_path_factory, fmt, seed, n, e, d, with_split, parts, partitioner):
    tmp = tmp_path_factory.mktemp("e2e")
    graph = random_graph(seed, n, e, d, with_split)
    src = tmp / "input"
    if fmt == "npz":
        src = tmp / "input.npz"
        graph = write_npz(src, graph, rng=np.random.default_rng(seed))
    elif fmt == "ogb":
        write_ogb(src, graph)
    else:
        write_numpy(src, graph)
    import_dataset(src, tmp / "raw", fmt=fmt, options=ImportOptions(), progress=False)
    dataset = prepare_dataset(tmp / "raw", tmp / "ds", PrepareOptions(
        num_partitions=min(parts, n), partitioner=partitioner, progress=False))
    split = None if graph.split is None else tuple(np.unique(ids) for ids in graph.split)
    assert_round_trip(dataset, graph.src, graph.dst, graph.features, graph.labels, split)


def test_generate_then_prepare_round_trip(tmp_path):
    raw = generate_graph(tmp_path / "raw", num_nodes=3000, avg_degree=8, feat_dim=12, num_classes=4, seed=5,
                         progress=False)
    dataset = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(num_partitions=16, progress=False))
    pairs = list(iter_edge_chunks(raw, 1 << 30))
    src, dst = pairs[0]
    features = read_npy(raw.features)
    labels = read_npy(raw.labels)
    split = tuple(read_npy(raw.split(name)) for name in ("train", "val", "test"))
    assert_round_trip(dataset, src, dst, features, labels, split)
    # communities make METIS cut far fewer edges than the 15/16 a random assignment would
    assert dataset.manifest.edge_cut.fraction < 0.6


@pytest.mark.slow
def test_coauthor_physics_import_then_prepare(tmp_path):
    path = shared_graph("coauthor-physics.npz")
    import_dataset(path, tmp_path / "raw", fmt="npz", memory_budget=256 << 20, progress=False)
    dataset = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(
        num_partitions=32, memory_budget=512 << 20, progress=False))
    z = np.load(path)
    indptr, indices = z["adj_indptr"], z["adj_indices"]
    n = len(indptr) - 1
    new_to_orig = read_npy(dataset.file("new_to_orig"))
    orig_to_new = np.empty(n, dtype=np.int64)
    orig_to_new[new_to_orig] = np.arange(n)
    got_ptr = read_npy(dataset.file("indptr"))
    got = np.repeat(np.arange(n), np.diff(got_ptr)) * n + read_npy(dataset.file("indices"))
    src = np.repeat(np.arange(n), np.diff(indptr))
    np.testing.assert_array_equal(got, np.sort(orig_to_new[indices] * n + orig_to_new[src]))
    np.testing.assert_array_equal(read_npy(dataset.file("labels")), z["labels"][new_to_orig])
    # features of a sample of nodes, densified from the CSR attributes
    rows = np.random.default_rng(0).choice(n, 500, replace=False)
    feats = read_features(dataset)
    a_ptr, a_idx, a_val = z["attr_indptr"], z["attr_indices"], z["attr_data"]
    for new in rows.tolist():
        orig = int(new_to_orig[new])
        dense = np.zeros(int(z["attr_shape"][1]), np.float32)
        dense[a_idx[a_ptr[orig]:a_ptr[orig + 1]]] = a_val[a_ptr[orig]:a_ptr[orig + 1]]
        np.testing.assert_array_equal(feats[new], dense)
