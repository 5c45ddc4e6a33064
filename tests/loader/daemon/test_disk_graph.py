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
from loader.sampling.inmemory import STREAM_VAL, eval_split_batches
from loader.sampling.sampling import sample_pass
from proto.errors import UserError


def open_graph(path, metrics=None, **io):
    ds = open_dataset(path)
    config = IOConfig(**io)
    checks = load_read_checks(ds, blocks=True) if config.check_reads else None
    return DiskGraph(ds, config, metrics or DaemonMetrics(), checks=checks, count_cache=False)


@pytest.mark.parametrize("io", [{}, {"check_reads": False}, {"direct_io": True}], ids=["checked", "unchecked",
                                                                                       "direct"])
def test_passes_and_rows_equal_the_in_memory_graph_bitwise(dataset_3k, reference_3k, io):
    plan = eval_split_batches(reference_3k.splits["val"], 50, 0, STREAM_VAL)
    with_all = (-1, 2)  # every neighbour at hop 1: every list of a seed is read whole
    with_some = (5, 3)
    graph = open_graph(dataset_3k, **io)
    try:
        for fanouts in (with_all, with_some):
            want = sample_pass(reference_3k.graph, plan.seeds, 50, fanouts, plan.keys)
            got = graph.sample(plan.seeds, 50, fanouts, plan.keys, purpose="eval")
            for name in ("node_ptr", "nodes", "edge_ptr", "edge_src", "edge_dst", "num_sampled_nodes",
                         "num_sampled_edges"):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        nodes = np.random.default_rng(0).permutation(len(reference_3k.features))[:700]
        out = np.empty((len(nodes), reference_3k.features.shape[1]), reference_3k.features.dtype)
        graph.read_rows(nodes, np.arange(len(nodes)), out, purpose="eval")
        assert out.tobytes() == reference_3k.features[nodes].tobytes()
    finally:
        graph.close()


def test_reads_are_counted_per_request_under_their_purpose(dataset_3k, reference_3k):
    """One graph, two callers (the exact modes share theirs between training and evaluation): each read request is
    one latency observation, and its bytes and preads go to the purpose it was made for, none to the other."""
    metrics = DaemonMetrics()
    graph = open_graph(dataset_3k, metrics)

    def value(name, file, purpose):
        return metrics.registry.get_sample_value(name, {"file": file, "purpose": purpose}) or 0.0

    try:
        plan = eval_split_batches(reference_3k.splits["val"], 50, 0, STREAM_VAL)
        graph.sample(plan.seeds, 50, (5, 3), plan.keys, purpose="eval")
        lists = graph.sampler.reader.bytes_read
        requests = value("megabatch_disk_read_seconds_count", "indices", "eval")
        assert requests >= 1 and value("megabatch_disk_read_bytes_total", "indices", "eval") > 0
        nodes = np.arange(0, 3000, 7)
        out = np.empty((len(nodes), 16), np.float32)
        graph.read_rows(nodes, np.arange(len(nodes)), out, purpose="train")
        graph.read_rows(nodes[:3], np.arange(3), out, purpose="train")
        graph.read_rows(nodes[:0], np.arange(0), out, purpose="train")  # nothing asked: no request
    finally:
        graph.close()
    rows = graph.rows
    assert value("megabatch_disk_read_seconds_count", "features", "train") == 2
    assert value("megabatch_disk_read_bytes_total", "features", "train") == rows.bytes_read > 0
    assert value("megabatch_disk_reads_total", "features", "train") == rows.reads
    assert value("megabatch_disk_read_bytes_total", "features", "eval") == 0
    assert value("megabatch_disk_read_seconds_count", "indices", "train") == 0
    # the lists read for the pass, and nothing else, are evaluation's (the reader opened with an empty cache)
    assert value("megabatch_disk_read_bytes_total", "indices", "eval") == lists
    assert value("megabatch_disk_read_seconds_count", "indices", "eval") == requests


def test_a_shrunk_file_fails_a_read_in_one_line_naming_the_file(dataset_3k, tmp_path):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    graph = open_graph(copy)
    try:
        os.truncate(copy / "features.bin", 4096)
        os.truncate(copy / "indices.npy", 4096)
        out = np.empty((1, 16), np.float32)
        with pytest.raises(UserError, match="shrank") as rows:
            graph.read_rows(np.array([2999]), np.array([0]), out, purpose="train")
        with pytest.raises(UserError, match="shrank") as lists:
            graph.sample(np.array([2999]), 1, (-1,), np.zeros(1, np.uint64), purpose="train")
    finally:
        graph.close()
    for err, name in ((rows, "features.bin"), (lists, "indices.npy")):
        assert str(copy / name) in str(err.value) and "\n" not in str(err.value)


def test_a_changed_byte_fails_its_read_check(dataset_3k, tmp_path):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    graph = open_graph(copy)
    try:
        with open(copy / "features.bin", "r+b") as handle:  # node 0's row starts the file
            byte = handle.read(1)[0]
            handle.seek(0)
            handle.write(bytes([byte ^ 0x01]))
        with pytest.raises(CorruptData, match="features.bin"):
            graph.read_rows(np.array([0]), np.array([0]), np.empty((1, 16), np.float32), purpose="train")
    finally:
        graph.close()


def test_the_evaluation_charge_holds_indptr_maps_block_tables_and_buffers(dataset_3k):
    ds = open_dataset(dataset_3k)
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
