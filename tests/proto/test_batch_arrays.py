"""proto.batch_arrays: a batch written with open_batch reads back whole; a batch whose arrays contradict
each other is refused by BatchArrays.read with a SlotError naming the contradiction."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.batch_arrays import BatchArrays, BatchShape, open_batch
from proto.errors import SlotError
from proto.messages import BatchId
from proto.slots import HEADER_BYTES, SlotRing, slot_bytes_for

DIM = 3
CACHE_ROWS = 8


@st.composite
def batches(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """A valid batch as plain arrays (with a client cache plan or without)."""
    hops = draw(st.integers(1, 3))
    nodes = np.array([draw(st.integers(1, 6))] + [draw(st.integers(0, 6)) for _ in range(hops)], np.int64)
    edges = np.array([draw(st.integers(0, 10)) for _ in range(hops)], np.int64)
    n, e = int(nodes.sum()), int(edges.sum())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = {"n_id": rng.permutation(1000)[:n].astype(np.int64), "y": rng.integers(-1, 5, nodes[0]),
              "edge_index": rng.integers(0, n, (2, e)), "nodes_per_hop": nodes, "edges_per_hop": edges}
    if draw(st.booleans()):
        hit = rng.integers(-1, CACHE_ROWS, n).astype(np.int32)
        u = draw(st.integers(0, min(n, CACHE_ROWS)))
        arrays |= {"hit_slot": hit, "upd_slot": rng.permutation(CACHE_ROWS)[:u].astype(np.int32),
                   "upd_pos": rng.integers(0, n, u).astype(np.int32)}
        arrays["x"] = rng.random((int((hit < 0).sum()), DIM)).astype(np.float32)
    else:
        arrays["x"] = rng.random((n, DIM)).astype(np.float32)
    if draw(st.booleans()):
        arrays["x_agg"] = rng.random((n, DIM)).astype(np.float32)
    if draw(st.booleans()):
        arrays["class_weight"] = rng.random(5).astype(np.float32)  # y's labels are below 5
    if draw(st.booleans()):
        arrays["seed_group"] = rng.integers(0, 4, nodes[0]).astype(np.int32)
    pairs = draw(st.sampled_from(["", "train", "eval"]))
    count = draw(st.integers(0, 6))
    if pairs == "train":  # a link-prediction training batch: pairs among the seeds
        arrays["edge_label_index"] = rng.integers(0, nodes[0], (2, count))
        arrays["edge_label"] = (rng.random(count) < 0.5).astype(np.float32)
        if draw(st.booleans()):  # a buffer order's weighted pairs
            arrays["edge_weight"] = (2 * rng.random(count)).astype(np.float32)
    elif pairs == "eval":  # an evaluation batch: held-out pairs of the split's nodes
        arrays["pair_index"] = rng.integers(0, 50, (2, count))
        arrays["pair_tails"] = rng.integers(0, 50, (count, draw(st.integers(0, 3))))
    return arrays


def shape_of(arrays: dict[str, np.ndarray]) -> BatchShape:
    cached = "hit_slot" in arrays
    return BatchShape(len(arrays["n_id"]), len(arrays["y"]), arrays["edge_index"].shape[1],
                      len(arrays["edges_per_hop"]), DIM, np.dtype(np.float32),
                      shipped_rows=len(arrays["x"]) if cached else None,
                      num_updates=len(arrays["upd_slot"]) if cached else 0, aggregated="x_agg" in arrays,
                      num_classes=len(arrays.get("class_weight", ())), seed_groups="seed_group" in arrays,
                      pairs="train" if "edge_label" in arrays else "eval" if "pair_index" in arrays else "",
                      num_pairs=len(arrays.get("edge_label", arrays.get("pair_tails", ()))),
                      num_tails=arrays["pair_tails"].shape[1] if "pair_tails" in arrays else 0,
                      pair_weights="edge_weight" in arrays)


def written(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` written into a slot with open_batch and committed; the reader's views."""
    shape = shape_of(arrays)
    slot_bytes = slot_bytes_for(shape.specs(), HEADER_BYTES)
    ring = SlotRing(bytearray(2 * slot_bytes), 2, slot_bytes)
    out = open_batch(ring, 1, shape)
    for name, value in arrays.items():
        getattr(out.arrays, name)[...] = value
    assert out.commit(BatchId("train", 3, 0, 0, 0, 1)) == sum(a.nbytes for a in arrays.values())
    return ring.read(1, expect_seq=3).arrays


@settings(max_examples=60, deadline=None)
@given(batches())
def test_a_written_batch_reads_back_whole(arrays):
    read = BatchArrays.read(written(arrays), CACHE_ROWS)
    assert read.has_cache_plan == ("hit_slot" in arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(getattr(read, name), value)


def corrupt(arrays: dict[str, np.ndarray], how: str) -> str:
    """Break ``arrays`` one way in place; the message ``read`` must give."""
    n = len(arrays["n_id"])
    if how == "missing":
        del arrays["edge_index"]
        return "no 'edge_index'"
    if how == "dtype":
        arrays["y"] = arrays["y"].astype(np.int32)
        return "y: dtype int32"
    if how == "hops":
        arrays["edges_per_hop"] = arrays["edges_per_hop"][:-1]
        return "nodes_per_hop"
    if how == "n_id":
        arrays["n_id"] = np.append(arrays["n_id"], 7)
        return "n_id has"
    if how == "y":
        arrays["y"] = np.append(arrays["y"], 0)
        return "y has shape"
    if how == "edges":
        arrays["edge_index"] = np.zeros((2, arrays["edge_index"].shape[1] + 1), np.int64)
        return "edge_index has shape"
    if how == "position":
        arrays["edge_index"] = np.full((2, len(arrays["edge_index"][0]) + 1), n, np.int64)
        arrays["edges_per_hop"] = arrays["edges_per_hop"].copy()
        arrays["edges_per_hop"][0] += 1
        return "outside"
    if how == "rows":
        arrays["x"] = np.zeros((len(arrays["x"]) + 1, DIM), np.float32)
        return "x has"
    if how == "aggregates":
        arrays["x_agg"] = np.zeros((n + 1, DIM), np.float32)
        return "x_agg has shape"
    if how == "aggregate dtype":
        arrays["x_agg"] = np.zeros((n, DIM), np.float64)
        return "x_agg has shape .* and dtype float64"
    if how == "negative weight":
        arrays["class_weight"] = np.full(5, -1.0, np.float32)
        return "class_weight: expected finite, non-negative"
    if how == "weights short of a label":
        arrays["y"] = np.full(len(arrays["y"]), 4, np.int64)
        arrays["class_weight"] = np.ones(4, np.float32)
        return "class_weight has 4 classes, a seed is labelled 4"
    if how == "groups":
        arrays["seed_group"] = np.full(len(arrays["y"]) + 1, 0, np.int32)
        return "seed_group: expected non-negative int32"
    if how == "pair outside the seeds":
        arrays["edge_label_index"] = np.full((2, 1), len(arrays["y"]), np.int64)
        arrays["edge_label"] = np.ones(1, np.float32)
        return "edge_label_index holds a position outside the"
    if how == "labels short of the pairs":
        arrays["edge_label_index"] = np.zeros((2, 2), np.int64)
        arrays["edge_label"] = np.ones(1, np.float32)
        return "edge_label: expected float32 \\(2,\\)"
    if how == "label without pairs":
        arrays.pop("edge_label_index", None)
        arrays["edge_label"] = np.ones(1, np.float32)
        return "needs both edge_label_index and edge_label"
    if how == "pair weight":
        arrays["edge_label_index"] = np.zeros((2, 2), np.int64)
        arrays["edge_label"] = np.array([1, 0], np.float32)
        arrays["edge_weight"] = np.array([1, -0.5], np.float32)
        return "edge_weight holds a negative or non-finite weight"
    if how == "pair weights short of the pairs":
        arrays["edge_label_index"] = np.zeros((2, 2), np.int64)
        arrays["edge_label"] = np.array([1, 0], np.float32)
        arrays["edge_weight"] = np.ones(1, np.float32)
        return "edge_weight: expected float32 \\(2,\\)"
    if how == "pair weights without pairs":
        arrays.pop("edge_label_index", None)
        arrays.pop("edge_label", None)
        arrays["edge_weight"] = np.ones(1, np.float32)
        return "edge_weight without the training pairs"
    if how == "negative tail":
        arrays["pair_index"] = np.zeros((2, 1), np.int64)
        arrays["pair_tails"] = np.full((1, 2), -1, np.int64)
        return "pair_index or pair_tails holds a negative position"
    if how == "tails short of the pairs":
        arrays["pair_index"] = np.zeros((2, 2), np.int64)
        arrays["pair_tails"] = np.zeros((1, 2), np.int64)
        return "pair_tails: expected int64 \\(2, tails\\)"
    raise AssertionError(how)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["missing", "dtype", "hops", "n_id", "y", "edges", "position", "rows", "aggregates",
                                   "aggregate dtype", "negative weight", "weights short of a label", "groups",
                                   "pair outside the seeds", "labels short of the pairs", "label without pairs",
                                   "pair weight", "pair weights short of the pairs", "pair weights without pairs",
                                   "negative tail", "tails short of the pairs"]))
def test_a_batch_that_contradicts_itself_is_refused(arrays, how):
    message = corrupt(arrays, how)
    with pytest.raises(SlotError, match=message):
        BatchArrays.read(arrays, CACHE_ROWS)


def cached_batch() -> dict[str, np.ndarray]:
    return {"x": np.zeros((2, DIM), np.float32), "n_id": np.arange(3), "y": np.zeros(1, np.int64),
            "edge_index": np.array([[1, 2], [0, 0]]), "nodes_per_hop": np.array([1, 2]),
            "edges_per_hop": np.array([2]), "hit_slot": np.array([-1, 3, -1], np.int32),
            "upd_slot": np.array([5], np.int32), "upd_pos": np.array([2], np.int32)}


@pytest.mark.parametrize("change, message", [
    (lambda a: a["hit_slot"].__setitem__(1, CACHE_ROWS), "hit_slot outside"),
    (lambda a: a["hit_slot"].__setitem__(0, -2), "hit_slot outside"),
    (lambda a: a["hit_slot"].__setitem__(0, 4), "x has 2 rows, the cache plan ships 1"),
    (lambda a: a["upd_slot"].__setitem__(0, CACHE_ROWS), "upd_slot/upd_pos"),
    (lambda a: a["upd_pos"].__setitem__(0, 3), "upd_slot/upd_pos"),
    (lambda a: a.__setitem__("upd_pos", np.zeros(2, np.int32)), "upd_slot/upd_pos"),
    (lambda a: a.__setitem__("upd_slot", np.array([1], np.int64)), "int32"),
    (lambda a: a.pop("upd_pos"), "int32"),
    (lambda a: a.__setitem__("hit_slot", np.array([-1, -1], np.int32)), "hit_slot has shape"),
])
def test_a_cache_plan_that_does_not_fit_its_batch_is_refused(change, message):
    arrays = cached_batch()
    assert BatchArrays.read(arrays, CACHE_ROWS).has_cache_plan
    change(arrays)
    with pytest.raises(SlotError, match=message):
        BatchArrays.read(arrays, CACHE_ROWS)


def test_a_cache_plan_for_a_session_without_a_cache_is_refused():
    with pytest.raises(SlotError, match="this session has no feature cache"):
        BatchArrays.read(cached_batch(), 0)
