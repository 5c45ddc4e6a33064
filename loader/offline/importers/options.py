"""Options shared by every importer (``megabatch import``)."""

import math
from dataclasses import dataclass
from typing import Any

from loader.format.link import DEFAULT_EDGE_SPLIT, TASKS, check_edge_split
from loader.format.raw import FEATURE_DTYPES
from proto.errors import UserError

__all__ = ["ImportOptions"]


@dataclass(frozen=True)
class ImportOptions:
    """How to turn a source graph into a raw dataset.

    undirected: also store the reverse ``dst -> src`` of every edge (self-loops are not doubled);
    drop_self_loops: drop edges ``i -> i``; dedup: keep one copy of each ``(src, dst)`` pair.
    With ``undirected`` or ``dedup`` the stored edges come out sorted by ``(src, dst)``;
    otherwise they keep the input order.
    split: train/val/test ratios of the seeded stratified split made when the source has no
    split of its own (or ``force_split`` asks to ignore it); split_seed seeds it.
    feat_dtype: stored feature dtype, ``float32`` or ``float16``.
    task: ``node`` (default) or ``link``: a link dataset also gets a seeded split of its pairs
    (``loader.offline.link_split``) with ``edge_split`` ratios (default 0.85/0.05/0.10, summing to
    1), seeded by ``edge_split_seed`` (default 0), and ``eval_negatives`` (default 100) random tails
    per held-out positive. The link options are ignored for ``node``.
    """

    undirected: bool = False
    drop_self_loops: bool = False
    dedup: bool = False
    split: tuple[float, float, float] = (0.6, 0.2, 0.2)
    split_seed: int = 0
    force_split: bool = False
    feat_dtype: str = "float32"
    task: str = "node"
    edge_split: tuple[float, float, float] = DEFAULT_EDGE_SPLIT
    edge_split_seed: int = 0
    eval_negatives: int = 100

    def __post_init__(self) -> None:
        if self.feat_dtype not in FEATURE_DTYPES:
            raise UserError(f"--feat-dtype: {self.feat_dtype!r} is not one of {', '.join(FEATURE_DTYPES)}")
        ratios = tuple(self.split)
        if (len(ratios) != 3 or not all(isinstance(r, (int, float)) and math.isfinite(r) and r >= 0
                                        for r in ratios) or sum(ratios) > 1 + 1e-9):
            raise UserError(f"--split: {self.split!r} must be three non-negative ratios summing to at most 1")
        if not isinstance(self.split_seed, int) or isinstance(self.split_seed, bool) or self.split_seed < 0:
            raise UserError(f"--split-seed: {self.split_seed!r} must be a non-negative integer")
        if self.task not in TASKS:
            raise UserError(f"--task: {self.task!r} is not one of {', '.join(TASKS)}")
        check_edge_split(self.edge_split)
        for name, value, least in (("--edge-split-seed", self.edge_split_seed, 0),
                                   ("--eval-negatives", self.eval_negatives, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise UserError(f"{name}: {value!r} must be an integer of at least {least}")

    @property
    def rewrites_edges(self) -> bool:
        """Whether edges go through the external sort (symmetrize and/or deduplicate)."""
        return self.undirected or self.dedup

    def to_json(self) -> dict[str, Any]:
        """The options as recorded in the raw dataset's provenance (a node import's exactly as before)."""
        data: dict[str, Any] = {
            "undirected": self.undirected, "drop_self_loops": self.drop_self_loops, "dedup": self.dedup,
            "split": [float(r) for r in self.split], "split_seed": self.split_seed,
            "force_split": self.force_split, "feat_dtype": self.feat_dtype}
        if self.task == "link":
            data.update(task="link", edge_split=[float(r) for r in self.edge_split],
                        edge_split_seed=self.edge_split_seed, eval_negatives=self.eval_negatives)
        return data
