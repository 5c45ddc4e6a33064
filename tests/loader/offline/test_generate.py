"""Tests for the synthetic graph generator (loader/offline/generate.py)."""

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loader.format.npyio import read_npy
from loader.format.raw import RawDataset, open_raw, validate_raw
from loader.offline.generate import GENERATOR, generate_graph
from proto.errors import UserError

N, AVG_DEGREE, DIM, CLASSES, SEED = 4000, 10.0, 32, 4, 7


def _generate(out: Path, **overrides: Any) -> RawDataset:
    args: dict[str, Any] = {"num_nodes": N, "avg_degree": AVG_DEGREE, "feat_dim": DIM, "num_classes": CLASSES,
                            "seed": SEED, "progress": False}
    args.update(overrides)
    return generate_graph(out, **args)


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    raw = _generate(tmp_path_factory.mktemp("gen") / "g")
    return {"raw": raw, "src": read_npy(raw.edge_src), "dst": read_npy(raw.edge_dst),
            "x": read_npy(raw.features).astype(np.float64), "y": read_npy(raw.labels),
            "split": [read_npy(raw.split(name)) for name in ("train", "val", "test")]}


def test_output_is_a_valid_raw_dataset(graph: dict[str, Any]) -> None:
    raw = open_raw(graph["raw"].path)
    validate_raw(raw, 1 << 20, progress=False)
    head = raw.header
    assert (head.num_nodes, head.feat_dim, head.num_classes, head.feat_dtype) == (N, DIM, CLASSES, "float32")
    assert head.num_edges == 2 * round(N * AVG_DEGREE / 2) == len(graph["src"])
    assert head.has_split
    assert head.source["generator"] == GENERATOR
    assert (head.source["num_nodes"], head.source["seed"], head.source["avg_degree"]) == (N, SEED, AVG_DEGREE)
    assert "memory_budget" not in head.source
    assert graph["x"].shape == (N, DIM) and read_npy(raw.features).dtype == np.float32
    assert graph["y"].dtype == np.int64 and graph["y"].min() >= 0 and graph["y"].max() < CLASSES
    assert set(np.unique(graph["y"]).tolist()) == set(range(CLASSES))
    assert not any(p.name.startswith(".") for p in raw.path.parent.iterdir())


def test_split_is_disjoint_and_follows_ratios(graph: dict[str, Any]) -> None:
    train, val, test = graph["split"]
    assert len(np.intersect1d(train, val)) == len(np.intersect1d(train, test)) == len(np.intersect1d(val, test)) == 0
    # stratified_split rounds per class, which can leave a node per class unassigned
    assert N - CLASSES <= len(train) + len(val) + len(test) <= N
    for ids, ratio in zip((train, val, test), (0.6, 0.2, 0.2)):
        assert abs(len(ids) / N - ratio) < 0.01


def test_float16_features(tmp_path: Path) -> None:
    raw = _generate(tmp_path / "g", num_nodes=500, feat_dtype="float16", split=(0.5, 0.25, 0.25))
    validate_raw(raw, 1 << 20, progress=False)
    assert raw.header.feat_dtype == "float16"
    feats = read_npy(raw.features)
    assert feats.dtype == np.float16 and feats.shape == (500, DIM)
    assert len(read_npy(raw.split("train"))) == 250


def test_same_seed_gives_identical_files(tmp_path: Path) -> None:
    first = _files(_generate(tmp_path / "a").path)
    second = _files(_generate(tmp_path / "b").path)
    assert sorted(first) == ["edge_dst.npy", "edge_src.npy", "features.npy", "labels.npy", "raw.json",
                             "test_idx.npy", "train_idx.npy", "val_idx.npy"]
    assert first == second


def test_different_seed_gives_different_graph(tmp_path: Path) -> None:
    first = _files(_generate(tmp_path / "a").path)
    other = _files(_generate(tmp_path / "b", seed=SEED + 1).path)
    for name in ("edge_src.npy", "edge_dst.npy", "features.npy", "labels.npy", "train_idx.npy"):
        assert first[name] != other[name], name


def test_memory_budget_does_not_change_output(tmp_path: Path) -> None:
    # 4 edge blocks of 65536 and 5 feature blocks of 4096 rows; the budgets group them one
    # per chunk, several per uneven chunk (edges 3+1, features 4+1), and all in one chunk.
    args = {"num_nodes": 20_000, "avg_degree": 20.0, "feat_dim": 64, "num_classes": 3}
    outputs = [_files(_generate(tmp_path / f"b{budget}", memory_budget=budget, **args).path)
               for budget in (1, 12 << 20, 30 << 20, 1 << 30)]
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3]


def test_no_self_loops_and_every_edge_has_its_reverse(graph: dict[str, Any]) -> None:
    src, dst = graph["src"], graph["dst"]
    assert not np.any(src == dst)
    forward = np.sort(src * N + dst)
    backward = np.sort(dst * N + src)
    assert np.array_equal(forward, backward)


def test_degrees_are_heavy_tailed(graph: dict[str, Any]) -> None:
    degree = np.bincount(graph["dst"], minlength=N)
    assert degree.mean() == pytest.approx(AVG_DEGREE)
    assert degree.max() >= 5 * degree.mean()
    top = np.sort(degree)[::-1]
    # The top 2% of nodes hold several times their proportional share of edge endpoints.
    assert top[: N // 50].sum() / degree.sum() >= 3 * 0.02
    assert np.median(degree) < degree.mean()


def test_duplicate_edges_are_rare(graph: dict[str, Any]) -> None:
    keys = graph["src"] * N + graph["dst"]
    assert 1 - len(np.unique(keys)) / len(keys) < 0.08


def test_edges_are_homophilous(graph: dict[str, Any]) -> None:
    y = graph["y"]
    same = np.mean(y[graph["src"]] == y[graph["dst"]])
    assert same >= 1 / CLASSES + 0.4


def _centroid_accuracy(feats: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray) -> float:
    centroids = np.stack([feats[train][y[train] == c].mean(axis=0) for c in range(CLASSES)])
    dist = ((feats[test][:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
    return float(np.mean(dist.argmin(axis=1) == y[test]))


def test_neighbour_aggregation_beats_raw_features(graph: dict[str, Any]) -> None:
    """A numpy stand-in for "GraphSAGE beats an MLP": nearest class centroid on raw features
    versus on features plus the mean of in-neighbours' features."""
    x, y, src, dst = graph["x"], graph["y"], graph["src"], graph["dst"]
    train, _val, test = graph["split"]
    degree = np.bincount(dst, minlength=N)
    neighbour_sum = np.zeros_like(x)
    np.add.at(neighbour_sum, dst, x[src])
    aggregated = x + neighbour_sum / np.maximum(degree, 1)[:, None]
    raw_acc = _centroid_accuracy(x, y, train, test)
    agg_acc = _centroid_accuracy(aggregated, y, train, test)
    assert raw_acc > 1 / CLASSES + 0.1  # features carry signal on their own
    assert agg_acc >= raw_acc + 0.10


def test_tiny_graph_has_no_self_loops(tmp_path: Path) -> None:
    # Two nodes in eight communities: in-community draws always hit the node itself, so
    # every such edge goes through the redraws and the last-resort fallback.
    raw = _generate(tmp_path / "g", num_nodes=2, avg_degree=1.0, feat_dim=3, num_classes=2)
    validate_raw(raw, 1 << 20, progress=False)
    src, dst = read_npy(raw.edge_src), read_npy(raw.edge_dst)
    assert len(src) == 2 and not np.any(src == dst)


def test_progress_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="megabatch"):
        _generate(tmp_path / "g", num_nodes=300, progress=True)
    text = caplog.text
    assert "generate edges" in text and "generate features" in text


@pytest.mark.parametrize(("overrides", "option"), [
    ({"num_nodes": 1}, "--nodes"),
    ({"num_nodes": 2.5}, "--nodes"),
    ({"avg_degree": 0}, "--avg-degree"),
    ({"avg_degree": -1.0}, "--avg-degree"),
    ({"avg_degree": float(N)}, "--avg-degree"),
    ({"avg_degree": float("nan")}, "--avg-degree"),
    ({"feat_dim": 0}, "--feat-dim"),
    ({"num_classes": 1}, "--classes"),
    ({"num_classes": N + 1}, "--classes"),
    ({"seed": -1}, "--seed"),
    ({"feat_dtype": "float64"}, "--feat-dtype"),
    ({"split": (0.8, 0.2, 0.2)}, "--split"),
    ({"split": (0.5, -0.1, 0.2)}, "--split"),
    ({"split": (0.5, 0.5)}, "--split"),
    ({"memory_budget": 0}, "--memory-budget"),
])
def test_bad_arguments_raise_user_error(tmp_path: Path, overrides: dict[str, Any], option: str) -> None:
    with pytest.raises(UserError, match=f"^{option} ") as info:
        _generate(tmp_path / "g", **overrides)
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_refused_and_left_untouched(tmp_path: Path) -> None:
    out = tmp_path / "g"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="already exists"):
        _generate(out)
    assert [p.name for p in tmp_path.iterdir()] == ["g"]
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
