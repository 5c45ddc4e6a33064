"""What the publisher fills a slot from: a ``RowSource`` for the feature rows, plus ids and labels.

Every mode hands the publisher a ``SlotSource`` per sampled pass. The rows are where modes differ
(a gather from RAM, a memory map or the hierarchical arena; the exact mode's cache plan; the
static cache plus disk reads), so they are one small class per kind of source, not a closure
per call site; ids and labels are plain arrays indexed by the pass's local ids.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from loader.daemon.gather_kernels import gather_rows
from loader.format.feature_codec import FeatureCodec
from loader.format.partition_table import row_offsets_for
from loader.sampling.link_sampling import HeldOutShares, PassLinkLabels

__all__ = ["RowSource", "GatheredRows", "DenseRows", "FileRows", "OffsetRows", "DecodedRows", "coded_rows",
           "SlotSource"]


class RowSource(ABC):
    """Feature rows of a pass's batches, written into a slot's ``x``."""

    fills_any_subset: bool = True
    """``fill`` accepts any subset of a batch's nodes, in any order (a plain gather), so a slot for a
    client with a feature cache gathers only the rows it ships. False (the exact mode, whose cache
    plan needs every batch whole and in order): the whole batch is gathered into scratch first."""

    @abstractmethod
    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        """Write the rows of ``nodes`` (batch ``b`` of the pass, local ids) into ``x``, a (len(nodes), D)
        view of the slot in the feature dtype."""


class GatheredRows(RowSource):
    """Rows copied out of one byte array (in RAM or memory-mapped) at per-node byte offsets."""

    def __init__(self, data: np.ndarray, row_bytes: int) -> None:
        self.data = data
        """uint8 1-D."""
        self.row_bytes = row_bytes

    @abstractmethod
    def offsets(self, nodes: np.ndarray) -> np.ndarray:
        """int64 byte offset in ``data`` of each node's row."""

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        gather_rows(self.data, self.offsets(nodes), self.row_bytes, np.arange(len(nodes), dtype=np.int64),
                    x.reshape(-1).view(np.uint8))


class DenseRows(GatheredRows):
    """A dense (N, D) feature matrix: node ``i``'s row at ``i * row_bytes`` (the in-memory mode)."""

    def offsets(self, nodes: np.ndarray) -> np.ndarray:
        return np.asarray(nodes, dtype=np.int64) * self.row_bytes


class FileRows(GatheredRows):
    """``features.bin`` (memory-mapped), laid out partition by partition; local ids are dataset ids."""

    def __init__(self, data: np.ndarray, row_bytes: int, node_begin: np.ndarray, feat_offset: np.ndarray) -> None:
        super().__init__(data, row_bytes)
        self.node_begin, self.feat_offset = node_begin, feat_offset

    def offsets(self, nodes: np.ndarray) -> np.ndarray:
        return row_offsets_for(nodes, self.node_begin, self.feat_offset, self.row_bytes)


class OffsetRows(GatheredRows):
    """Rows at offsets resolved once per pass (a mega-batch's ``row_offsets`` into the arena)."""

    def __init__(self, data: np.ndarray, row_bytes: int, row_offsets: np.ndarray) -> None:
        super().__init__(data, row_bytes)
        self.row_offsets = row_offsets
        """int64, one per local id."""

    def offsets(self, nodes: np.ndarray) -> np.ndarray:
        return self.row_offsets[nodes]


class DecodedRows(RowSource):
    """Rows stored as 8-bit codes (``prepare --feat-dtype uint8``), decoded to float32 as they are written: every
    cache, buffer and read holds codes (a quarter of float32's bytes), and a batch carries values."""

    def __init__(self, codes: RowSource, codec: FeatureCodec) -> None:
        self.codes, self.codec = codes, codec
        self.fills_any_subset = codes.fills_any_subset

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        codes = np.empty((len(nodes), self.codec.dim), dtype=np.uint8)  # a batch's codes: a quarter of its x
        self.codes.fill(b, nodes, codes)
        self.codec.decode(codes, out=x)


def coded_rows(rows: RowSource, codec: FeatureCodec | None, feat_dim: int) -> RowSource:
    """``rows``, decoded by ``codec`` where the dataset stores codes."""
    if codec is None:
        return rows
    if codec.dim != feat_dim:
        raise ValueError(f"feature codes of {codec.dim} columns for rows of {feat_dim}")
    return DecodedRows(rows, codec)


@dataclass(frozen=True)
class SlotSource:
    """Where the batches of one sampled pass get their rows, dataset ids and labels."""

    rows: RowSource
    label_of: np.ndarray
    """int64 label per local id (-1 = unlabeled)."""
    id_of: np.ndarray | None
    """int64 dataset id per local id; None where local ids are dataset ids (the full-graph modes)."""
    feat_dim: int
    feat_dtype: np.dtype
    class_weight: np.ndarray | None = None
    """float32 (C,) per class, written into every batch as ``class_weight`` (``[hierarchy] label_prior_loss``);
    None: batches carry none."""
    aggregates: RowSource | None = None
    """The pass's x_agg rows where the mode holds them (the hierarchical arena), for batches that carry x_agg;
    None: read by dataset id (``aggregate_rows.AggregateRows``)."""
    link_labels: PassLinkLabels | None = None
    """A pass of link-prediction training batches: each batch's ``edge_label_index`` and ``edge_label``."""
    eval_pairs: HeldOutShares | None = None
    """A pass of a link-prediction evaluation stream: each batch's share of the split's pairs (``pair_index``,
    ``pair_tails``)."""

    def global_ids(self, nodes: np.ndarray) -> np.ndarray:
        return np.asarray(nodes, dtype=np.int64) if self.id_of is None else self.id_of[nodes]

    def labels(self, nodes: np.ndarray) -> np.ndarray:
        return self.label_of[nodes]
