"""The graph read through checked preads: the in-memory sampler's passes and rows, faults as one line, its charge."""

import os
import shutil

import numpy as np
import pytest

from loader.caches.row_reader import DEFAULT_MAX_SPAN
from loader.daemon.config import IOConfig
from loader.daemon.disk_graph import ROW_READ_THREADS, SAMPLER_MAP_BYTES, DiskGraph, eval_graph_bytes
from loader.daemon.metrics import DaemonMetrics
from loader.format.dataset import open_dataset
from loader.format.read_checks import CorruptData, block_table_bytes, load_read_checks
from loader.sampling.inmemory import STREAM_VAL, eval_split_batches, load_in_memory
from loader.sampling.sampling import sample_pass
from proto.errors import UserError
from tests.daemon_harness import small_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return small_dataset(tmp_path_factory.mktemp("disk_graph"))


@pytest.fixture(scope="module")
def reference(dataset):
    return load_in_memory(open_dataset(dataset))


def open_graph(path, **io):
    ds = open_dataset(path)
    config = IOConfig(**io)
    checks = load_read_checks(ds, blocks=True) if config.check_reads else None
    return DiskGraph(ds, config, DaemonMetrics(), checks=checks, count_cache=False)


@pytest.mark.parametrize("io", [{}, {"check_reads": False}, {"direct_io": True}], ids=["checked", "unchecked",
                                                                                       "direct"])
def test_passes_and_rows_equal_the_in_memory_graph_bitwise(dataset, reference, io):
    plan = eval_split_batches(reference.splits["val"], 50, 0, STREAM_VAL)
    with_all = (-1, 2)  # every neighbour at hop 1: every list of a seed is read whole
    with_some = (5, 3)
    graph = open_graph(dataset, **io)
    try:
        for fanouts in (with_all, with_some):
            want = sample_pass(reference.graph, plan.seeds, 50, fanouts, plan.keys)
            got = graph.sample(plan.seeds, 50, fanouts, plan.keys)
            for name in ("node_ptr", "nodes", "edge_ptr", "edge_src", "edge_dst", "num_sampled_nodes",
                         "num_sampled_edges"):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        nodes = np.random.default_rng(0).permutation(len(reference.features))[:700]
        out = np.empty((len(nodes), reference.features.shape[1]), reference.features.dtype)
        graph.read_rows(nodes, np.arange(len(nodes)), out)
        assert out.tobytes() == reference.features[nodes].tobytes()
    finally:
        graph.close()


def test_a_shrunk_file_fails_a_read_in_one_line_naming_the_file(dataset, tmp_path):
    copy = shutil.copytree(dataset, tmp_path / "ds")
    graph = open_graph(copy)
    try:
        os.truncate(copy / "features.bin", 4096)
        os.truncate(copy / "indices.npy", 4096)
        out = np.empty((1, 16), np.float32)
        with pytest.raises(UserError, match="shrank") as rows:
            graph.read_rows(np.array([2999]), np.array([0]), out)
        with pytest.raises(UserError, match="shrank") as lists:
            graph.sample(np.array([2999]), 1, (-1,), np.zeros(1, np.uint64))
    finally:
        graph.close()
    for err, name in ((rows, "features.bin"), (lists, "indices.npy")):
        assert str(copy / name) in str(err.value) and "\n" not in str(err.value)


def test_a_changed_byte_fails_its_read_check(dataset, tmp_path):
    copy = shutil.copytree(dataset, tmp_path / "ds")
    graph = open_graph(copy)
    try:
        with open(copy / "features.bin", "r+b") as handle:  # node 0's row starts the file
            byte = handle.read(1)[0]
            handle.seek(0)
            handle.write(bytes([byte ^ 0x01]))
        with pytest.raises(CorruptData, match="features.bin"):
            graph.read_rows(np.array([0]), np.array([0]), np.empty((1, 16), np.float32))
    finally:
        graph.close()


def test_the_evaluation_charge_holds_indptr_maps_block_tables_and_buffers(dataset):
    ds = open_dataset(dataset)
    n = ds.manifest.num_nodes
    unchecked = eval_graph_bytes(ds, IOConfig(check_reads=False), 0, (5, 3))
    assert unchecked == 8 * (n + 1) + SAMPLER_MAP_BYTES * n + ROW_READ_THREADS * DEFAULT_MAX_SPAN
    checked = eval_graph_bytes(ds, IOConfig(), 0, (5, 3))
    assert checked - unchecked == block_table_bytes(ds) > 0
    # a batch's lists; checked reads stage them in whole pages first, never more pages than the file has
    lists = eval_graph_bytes(ds, IOConfig(check_reads=False), 100, (5, 3)) - unchecked
    staged = eval_graph_bytes(ds, IOConfig(), 100, (5, 3)) - checked
    assert 0 < lists < staged
    huge = eval_graph_bytes(ds, IOConfig(), 10**6, (5, 3)) - checked
    huge_lists = eval_graph_bytes(ds, IOConfig(check_reads=False), 10**6, (5, 3)) - unchecked
    assert huge - huge_lists == ds.manifest.files["indices.npy"].bytes + 4096
