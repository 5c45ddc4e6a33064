"""The in-memory dataset and the batch plans both training modes share."""

import numpy as np
import pytest

from loader.format.dataset import open_dataset
from loader.offline.prepare import PrepareOptions, prepare_dataset
from loader.sampling.inmemory import (
    STREAM_SHUFFLE,
    STREAM_TEST,
    STREAM_TRAIN,
    STREAM_VAL,
    epoch_batches_inmemory,
    eval_split_batches,
    load_in_memory,
    num_batches,
    shuffle_key,
    split_stream,
)
from loader.sampling.sampling import batch_keys
from proto.errors import UserError
from tests.graphs import random_graph, write_raw


def _prepared(tmp_path, feat_dtype=None, d=5, n=500):
    src, dst, features, labels = random_graph(np.random.default_rng(3), n, 3000, d, classes=4)
    ids = np.random.default_rng(4).permutation(n)
    split = (np.sort(ids[:300]), np.sort(ids[300:400]), np.sort(ids[400:]))
    write_raw(tmp_path / "raw", src, dst, features, labels, 4, split)
    # 5-dim float rows are 20 bytes: every partition but the first starts after zero padding
    prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(num_partitions=7, memory_budget=256 << 20,
                                                                      feat_dtype=feat_dtype, progress=False))
    return open_dataset(tmp_path / "ds"), src, dst, features, labels, split


@pytest.mark.parametrize("feat_dtype", [None, "float16"])
def test_load_in_memory_matches_the_raw_graph(tmp_path, feat_dtype):
    dataset, src, dst, features, labels, split = _prepared(tmp_path, feat_dtype)
    data = load_in_memory(dataset)
    new_to_orig = dataset.read("new_to_orig", np.int64, 1)
    orig_to_new = np.argsort(new_to_orig)
    assert data.features.dtype == np.dtype(feat_dtype or "float32") and data.features.shape == (500, 5)
    np.testing.assert_array_equal(data.features, features[new_to_orig].astype(data.features.dtype))
    np.testing.assert_array_equal(data.labels, labels[new_to_orig])
    assert data.num_classes == 4 and data.num_nodes == 500 and data.feat_dim == 5
    np.testing.assert_array_equal(data.graph.global_ids, np.arange(500))
    for name, ids in zip(("train", "val", "test"), split):
        np.testing.assert_array_equal(data.splits[name], np.sort(orig_to_new[ids]))
    # every edge u->v of the raw graph is an in-neighbour entry of v (with multiplicity)
    g = data.graph
    got = sorted(zip(g.indices.tolist(), np.repeat(np.arange(500), np.diff(g.indptr)).tolist()))
    assert got == sorted(zip(orig_to_new[src].tolist(), orig_to_new[dst].tolist()))


def test_truncated_features_are_a_user_error(tmp_path):
    dataset = _prepared(tmp_path)[0]
    path = dataset.file("features")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 4096)
    with pytest.raises(UserError, match="features.bin: truncated"):
        load_in_memory(dataset)


def test_epoch_plan_is_a_seeded_shuffle_with_one_key_per_batch():
    ids = np.arange(10, 1010, dtype=np.int64)
    plan = epoch_batches_inmemory(ids, 64, seed=7, epoch=3)
    assert sorted(plan.seeds.tolist()) == ids.tolist() and not np.array_equal(plan.seeds, ids)
    np.testing.assert_array_equal(plan.keys, batch_keys(7, STREAM_TRAIN, 3, 0, 0, 16))
    again = epoch_batches_inmemory(ids, 64, seed=7, epoch=3)
    np.testing.assert_array_equal(plan.seeds, again.seeds)
    other = epoch_batches_inmemory(ids, 64, seed=7, epoch=4)
    assert not np.array_equal(plan.seeds, other.seeds) and not np.array_equal(plan.keys[:1], other.keys[:1])
    assert shuffle_key(7, 3) != shuffle_key(7, 4) != shuffle_key(8, 4)


def test_eval_plan_is_sorted_and_keyed_by_split():
    ids = np.array([9, 3, 5, 1], dtype=np.int64)
    val = eval_split_batches(ids, 3, seed=2, stream=split_stream("val"))
    assert val.seeds.tolist() == [1, 3, 5, 9]
    np.testing.assert_array_equal(val.keys, batch_keys(2, STREAM_VAL, 0, 0, 0, 2))
    test = eval_split_batches(ids, 3, seed=2, stream=split_stream("test"))
    np.testing.assert_array_equal(test.keys, batch_keys(2, STREAM_TEST, 0, 0, 0, 2))
    assert len({STREAM_TRAIN, STREAM_VAL, STREAM_TEST, STREAM_SHUFFLE}) == 4
    with pytest.raises(ValueError, match="split"):
        split_stream("train")


def test_num_batches_rounds_up():
    assert [num_batches(n, 4) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
    with pytest.raises(ValueError):
        num_batches(3, 0)


@pytest.mark.parametrize("where", ["a row", "a partition's padding"])
def test_a_changed_feature_byte_fails_its_partitions_check(tmp_path, where):
    from loader.format.read_checks import CorruptData

    dataset = _prepared(tmp_path)[0]
    parts = dataset.partitions()
    offset = int(parts.feat_offset[1]) + (0 if where == "a row" else int(parts.feat_nbytes[1]))
    path = dataset.file("features")
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match="partition 1's features range"):
        load_in_memory(dataset)
