"""Link prediction data of a dataset: the edge split, its files, and the edge-bucket order.

A dataset's task is ``node`` (node classification, the default: nothing here applies) or ``link``.
A link dataset holds, beside the graph (docs/FORMAT.md, "Link prediction"):

- ``train_edges.npy``: int64 (2, E_train), the training positives, source row 0, target row 1;
- ``val_edges.npy``, ``test_edges.npy``: int64 (2, E_split), the held-out positives, which the
  graph does not contain;
- ``val_neg_tails.npy``, ``test_neg_tails.npy``: int64 (E_split, K), K fixed random tails per
  held-out positive (its negatives are ``(source, tail)``);
- prepared datasets only: ``edge_buckets.npy``, int64 (P*P + 1,), the offsets of the edge buckets
  in ``train_edges.npy`` (``bucket_keys``).

The unit of the split is a *pair*: an unordered pair {u, v} (stored once, as ``(min, max)`` of the
original ids) in an undirected graph, an ordered pair (u, v) in a directed one; ``unit_keys`` gives
each edge its pair's key.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from loader.format.npyio import NpyReader, rows_per_chunk
from proto.errors import UserError

__all__ = [
    "TASKS", "HELD_OUT", "RAW_LINK_FILES", "LINK_FILES", "MAX_LINK_PARTITIONS", "DEFAULT_EDGE_SPLIT",
    "LinkSplit", "parse_edge_split", "check_edge_split", "unit_keys", "bucket_keys", "decode_bucket_keys",
    "bucket_ids", "link_file_problems", "LinkTables", "read_link_tables", "read_edge_buckets",
]

TASKS = ("node", "link")
"""Values of ``task`` in ``raw.json`` and ``manifest.json`` (absent means ``node``)."""

HELD_OUT = ("val", "test")
"""The held-out splits, in file-name order."""

RAW_LINK_FILES = {
    "train_edges": "train_edges.npy", "val_edges": "val_edges.npy", "test_edges": "test_edges.npy",
    "val_neg_tails": "val_neg_tails.npy", "test_neg_tails": "test_neg_tails.npy",
}
"""Logical name -> file name of the link files of a raw dataset."""

LINK_FILES = {**RAW_LINK_FILES, "edge_buckets": "edge_buckets.npy"}
"""Logical name -> file name of the link files of a prepared dataset (format 1.3)."""

MAX_LINK_PARTITIONS = 4096
"""At most this many partitions in a link dataset: ``edge_buckets.npy`` and prepare's bucket counts hold
P*P + 1 int64 (128 MiB at 4096; 2 GiB at the 16,384 ``--partitions auto`` may choose for a node dataset)."""

DEFAULT_EDGE_SPLIT = (0.85, 0.05, 0.10)
"""``import --edge-split``'s default: train, val, test shares of the pairs."""

_SPLIT_SUM_TOLERANCE = 1e-6


def check_edge_split(ratios: Any, option: str = "--edge-split") -> tuple[float, float, float]:
    """Three finite ratios in [0, 1] summing to 1, train above 0; UserError naming ``option`` otherwise.

    They must sum to 1 because a pair in no split would be neither trained on nor evaluated, yet
    removed from the graph or not: neither is what anyone asking for a split means.
    """
    try:
        parts = tuple(float(r) for r in ratios)
    except (TypeError, ValueError):
        raise UserError(f"{option}: {ratios!r} is not three numbers like 0.85,0.05,0.10") from None
    if len(parts) != 3 or not all(math.isfinite(r) and 0 <= r <= 1 for r in parts):
        raise UserError(f"{option}: {ratios!r} must be three ratios in [0, 1] (train,val,test)")
    if abs(sum(parts) - 1.0) > _SPLIT_SUM_TOLERANCE:
        raise UserError(f"{option}: train,val,test ratios {ratios!r} sum to {sum(parts):g}, not 1")
    if parts[0] <= 0:
        raise UserError(f"{option}: the train ratio must be above 0 (the graph would lose every edge)")
    return parts[0], parts[1], parts[2]


def parse_edge_split(text: str) -> tuple[float, float, float]:
    """Parse ``"0.85,0.05,0.10"`` (``import --edge-split``) and check it (``check_edge_split``)."""
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--edge-split: cannot parse {text!r}; expected three numbers like 0.85,0.05,0.10") from None
    if len(parts) != 3:
        raise UserError(f"--edge-split: {text!r} has {len(parts)} values; expected train,val,test like 0.85,0.05,0.10")
    return check_edge_split(parts)


def _count(data: dict[str, Any], key: str, minimum: int = 0) -> int:
    if not isinstance(data, dict):
        raise TypeError("link is not an object")
    if key not in data:
        raise KeyError(f"link.{key}")
    value = data[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"link.{key} must be an integer of at least {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class LinkSplit:
    """The ``link`` table of ``raw.json`` and ``manifest.json``: how the pairs were split.

    directed: the split's unit is an ordered pair (True) or an unordered one (False: the graph
    stores both directions of every edge); edge_split: the train/val/test ratios asked for;
    seed: ``--edge-split-seed``; eval_negatives: K, tails per held-out positive; train, val,
    test: positives (pairs) per split.
    """

    directed: bool
    edge_split: tuple[float, float, float]
    seed: int
    eval_negatives: int
    train: int
    val: int
    test: int

    def __post_init__(self) -> None:
        for name in ("seed", "train", "val", "test"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"link.{name} must be a non-negative integer, got {value!r}")
        if not isinstance(self.eval_negatives, int) or self.eval_negatives < 1:
            raise ValueError(f"link.eval_negatives must be a positive integer, got {self.eval_negatives!r}")

    def of(self, split: str) -> int:
        """Positives in split ``split`` ("train", "val" or "test")."""
        sizes = {"train": self.train, "val": self.val, "test": self.test}
        return sizes[split]

    def to_json(self) -> dict[str, Any]:
        return {"directed": self.directed, "edge_split": [float(r) for r in self.edge_split], "seed": self.seed,
                "eval_negatives": self.eval_negatives, "train": self.train, "val": self.val, "test": self.test}

    @classmethod
    def from_json(cls, data: Any) -> "LinkSplit":
        """KeyError (``link.KEY``), TypeError or ValueError on a malformed table; callers name the file."""
        if not isinstance(data, dict):
            raise TypeError("link is not an object")
        if "directed" not in data or "edge_split" not in data:
            raise KeyError("link.directed" if "directed" not in data else "link.edge_split")
        ratios = data["edge_split"]
        if not isinstance(ratios, list) or len(ratios) != 3:
            raise ValueError(f"link.edge_split must be three ratios, got {ratios!r}")
        return cls(bool(data["directed"]), (float(ratios[0]), float(ratios[1]), float(ratios[2])),
                   _count(data, "seed"), _count(data, "eval_negatives", 1), _count(data, "train"),
                   _count(data, "val"), _count(data, "test"))


def unit_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int, directed: bool) -> np.ndarray:
    """int64 key of each edge's pair: ``src * N + dst`` (directed) or ``min * N + max`` (undirected).

    Both directions of an undirected edge get the same key, so a lookup of held-out keys removes both.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if directed:
        return src * num_nodes + dst
    return np.minimum(src, dst) * num_nodes + np.maximum(src, dst)


def bucket_keys(src: np.ndarray, dst: np.ndarray, node_begin: np.ndarray, node_end: np.ndarray,
                num_nodes: int) -> np.ndarray:
    """The sort key of the edge-bucket order: edges ordered by (partition of source, partition of
    target, source, target), as one int64 in ``[0, N * N)``.

    Partition i holds new ids ``[begin_i, end_i)`` (size s_i). Bucket (i, j) owns the s_i * s_j keys
    from ``begin_i * N + s_i * begin_j`` (the buckets of row i tile ``[begin_i * N, end_i * N)`` in j
    order), and edge (u, v) inside it is ``(u - begin_i) * s_j + (v - begin_j)``: a bijection, so an
    external sort on two ids (``key // N``, ``key % N``) sorts by the four.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    i = np.searchsorted(node_end, src, side="right")
    j = np.searchsorted(node_end, dst, side="right")
    size_i = node_end[i] - node_begin[i]
    size_j = node_end[j] - node_begin[j]
    return node_begin[i] * num_nodes + size_i * node_begin[j] + (src - node_begin[i]) * size_j + (dst - node_begin[j])


def decode_bucket_keys(keys: np.ndarray, node_begin: np.ndarray, node_end: np.ndarray, num_nodes: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` of ``bucket_keys``' keys (the inverse)."""
    keys = np.asarray(keys, dtype=np.int64)
    i = np.searchsorted(node_end, keys // num_nodes, side="right")
    size_i = node_end[i] - node_begin[i]
    rest = keys - node_begin[i] * num_nodes
    j = np.searchsorted(node_end, rest // np.maximum(size_i, 1), side="right")
    size_j = node_end[j] - node_begin[j]
    local = rest - size_i * node_begin[j]
    return node_begin[i] + local // np.maximum(size_j, 1), node_begin[j] + local % np.maximum(size_j, 1)


def bucket_ids(src: np.ndarray, dst: np.ndarray, node_end: np.ndarray) -> np.ndarray:
    """Bucket ``i * P + j`` of each edge (source in partition i, target in partition j)."""
    num_parts = len(node_end)
    return (np.searchsorted(node_end, src, side="right") * num_parts
            + np.searchsorted(node_end, dst, side="right")).astype(np.int64)


def link_file_problems(path_of: Callable[[str], Path], num_nodes: int, link: LinkSplit, chunk_bytes: int
                       ) -> list[str]:
    """Shape, dtype and id-range problems of the five link files every link dataset has (raw or prepared).

    Streams the edge lists in column chunks of about ``chunk_bytes``; one line per problem.
    """
    problems: list[str] = []
    columns = rows_per_chunk(32, chunk_bytes, minimum=1024)
    expect = {"train_edges": (2, link.train), "val_edges": (2, link.val), "test_edges": (2, link.test),
              "val_neg_tails": (link.val, link.eval_negatives), "test_neg_tails": (link.test, link.eval_negatives)}
    for name, shape in expect.items():
        path = path_of(name)
        try:
            with NpyReader(path, expect_dtype=np.int64, expect_ndim=2) as reader:
                if reader.shape != shape:
                    problems.append(f"{path.name} has shape {reader.shape}, expected {shape}")
                    continue
                if name.endswith("_edges"):
                    chunks = reader.column_chunks(columns)
                else:
                    chunks = reader.chunks(rows_per_chunk(max(1, reader.row_bytes) * 2, chunk_bytes))
                for start, ids in chunks:
                    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
                        problems.append(f"{path.name} holds node ids outside [0, {num_nodes}) "
                                        f"({'column' if name.endswith('_edges') else 'row'} {start} on)")
                        break
                    if name.endswith("_edges") and (ids[0] == ids[1]).any():
                        at = start + int(np.argmax(ids[0] == ids[1]))
                        problems.append(f"{path.name} holds a self-loop (column {at}); self-loops are never positives")
                        break
        except UserError as err:
            problems.append(str(err))
    return problems


class _LinkDataset(Protocol):
    """What ``read_link_tables`` uses of a ``loader.format.dataset.Dataset`` (which imports this module)."""

    def read(self, name: str, dtype: Any, ndim: int) -> np.ndarray: ...

    def file(self, name: str) -> Path: ...


@dataclass(frozen=True)
class LinkTables:
    """A prepared link dataset's pairs, checked against its manifest: ``train_edges`` int64 (2, E_train); per
    held-out split ``held_edges[split]`` int64 (2, E_split) and ``held_tails[split]`` int64 (E_split, K)."""

    train_edges: np.ndarray
    held_edges: dict[str, np.ndarray]
    held_tails: dict[str, np.ndarray]


def read_link_tables(dataset: _LinkDataset, link: LinkSplit, num_nodes: int) -> LinkTables:
    """The pair tables of ``dataset`` (its manifest's ``link`` and ``num_nodes``); UserError naming the file whose
    shape or node ids disagree with the manifest (one check, for every reader of them)."""

    def read(name: str, shape: tuple[int, int]) -> np.ndarray:
        array = dataset.read(name, np.int64, 2)
        if array.shape != shape:
            raise UserError(f"{dataset.file(name)}: shape {array.shape}, the manifest's link table says {shape}")
        if array.size and (array.min() < 0 or array.max() >= num_nodes):
            raise UserError(f"{dataset.file(name)}: node ids outside [0, {num_nodes})")
        return array

    return LinkTables(read("train_edges", (2, link.train)),
                      {split: read(f"{split}_edges", (2, link.of(split))) for split in HELD_OUT},
                      {split: read(f"{split}_neg_tails", (link.of(split), link.eval_negatives)) for split in HELD_OUT})


def read_edge_buckets(dataset: _LinkDataset, link: LinkSplit, num_partitions: int) -> np.ndarray:
    """``edge_buckets.npy``: int64 (P*P + 1,) offsets ending at E_train, checked; read only by what trains a buffer
    order (up to 128 MiB at ``MAX_LINK_PARTITIONS``)."""
    buckets = dataset.read("edge_buckets", np.int64, 1)
    expected = (num_partitions * num_partitions + 1,)
    if buckets.shape != expected or buckets[-1] != link.train:
        raise UserError(f"{dataset.file('edge_buckets')}: shape {buckets.shape}, expected {expected} offsets "
                        f"ending at the {link.train} training positives")
    return buckets
