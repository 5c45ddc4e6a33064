"""The typed sub-tables of ``manifest.json`` (docs/FORMAT.md, "manifest.json").

Each is read from and written back to exactly the JSON object the format specifies, so the format
is unchanged; code reads named fields instead of ``dict.get("...")`` with a guessed default. A
missing or malformed required field is a ``KeyError`` / ``ValueError`` that ``Manifest.from_json``
turns into a one-line error naming the manifest. ``created_by`` and ``source`` stay free-form
provenance dicts: nothing reads them but people and ``inspect``.
"""

from dataclasses import dataclass
from typing import Any

__all__ = ["PartitionerInfo", "EdgeCut", "StaticCacheInfo", "NeighborRankInfo", "SplitSizes"]


def _required(data: dict[str, Any], table: str, key: str) -> Any:
    """``data[key]``; a missing key is a KeyError naming ``table.key`` (the manifest's error says which)."""
    if not isinstance(data, dict):
        raise TypeError(f"{table} is not an object")
    if key not in data:
        raise KeyError(f"{table}.{key}")
    return data[key]


@dataclass(frozen=True)
class PartitionerInfo:
    """``partitioner``: which partitioner made the partitions, with what parameters, in how long."""

    name: str
    params: dict[str, Any]
    seconds: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "PartitionerInfo":
        return cls(str(_required(data, "partitioner", "name")), dict(data.get("params") or {}),
                   float(data.get("seconds", 0.0)))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "seconds": self.seconds}


@dataclass(frozen=True)
class EdgeCut:
    """``edge_cut``: edges whose endpoints lie in different partitions."""

    edges: int
    fraction: float
    """``edges / num_edges`` (0 for a graph without edges)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "EdgeCut":
        return cls(int(_required(data, "edge_cut", "edges")), float(_required(data, "edge_cut", "fraction")))

    def to_json(self) -> dict[str, Any]:
        return {"edges": self.edges, "fraction": self.fraction}


@dataclass(frozen=True)
class StaticCacheInfo:
    """``static_cache``: the prepared static nodes (``static_*.npy``)."""

    ratio: float
    """``prepare --static-ratio``: the share of nodes asked for."""
    num_nodes: int
    ranked_by: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StaticCacheInfo":
        return cls(float(_required(data, "static_cache", "ratio")), int(_required(data, "static_cache", "num_nodes")),
                   str(data.get("ranked_by", "")))

    def to_json(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "num_nodes": self.num_nodes, "ranked_by": self.ranked_by}


@dataclass(frozen=True)
class NeighborRankInfo:
    """``neighbor_rank``: how ``neighbor_rank.npy`` orders the nodes."""

    ranked_by: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "NeighborRankInfo":
        if not isinstance(data, dict):
            raise TypeError("neighbor_rank is not an object")
        return cls(str(data.get("ranked_by", "")))

    def to_json(self) -> dict[str, Any]:
        return {"ranked_by": self.ranked_by}


@dataclass(frozen=True)
class SplitSizes:
    """``splits``: nodes per split, and whether ``prepare`` made the split (the input had none)."""

    train: int
    val: int
    test: int
    generated: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SplitSizes":
        train, val, test = (int(_required(data, "splits", name)) for name in ("train", "val", "test"))
        return cls(train, val, test, bool(data.get("generated", False)))

    def to_json(self) -> dict[str, Any]:
        return {"generated": self.generated, "train": self.train, "val": self.val, "test": self.test}

    def of(self, split: str) -> int:
        """Nodes in split ``split`` ("train", "val" or "test")."""
        sizes = {"train": self.train, "val": self.val, "test": self.test}
        return sizes[split]
