"""The format-independent half of an import: validate what a reader yields and write it.

A format reader turns its input into an ``ImportSource`` (sizes, labels, an optional split
and re-startable chunk streams for edges and features); ``write_dataset`` checks every chunk
and streams it into a ``RawDatasetWriter``, so a bad input fails before the output appears.
"""

from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loader.format.npyio import NpyReader, NpyWriter, rows_per_chunk
from loader.format.raw import SPLIT_NAMES, RawDataset, RawDatasetWriter, open_raw
from loader.format.splits import stratified_split
from loader.offline.extsort import DISTRIBUTE_BYTES_PER_EDGE, external_sort_edges
from loader.offline.importers.options import ImportOptions
from loader.offline.link_split import GivenLinkSplit, split_link_edges, write_given_split
from proto.atomic import io_error
from proto.errors import UserError
from proto.progress import Progress

__all__ = [
    "ImportReadRequest",
    "ImportSource",
    "SplitArrays",
    "normalize_labels",
    "one_line",
    "split_from_mask",
    "write_dataset",
]

SplitArrays = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ImportReadRequest:
    """What a format reader is given: the input path, the memory budget for its chunks,
    whether the caller will use a split from the input, and whether to show progress."""

    src: Path
    memory_budget: int
    want_split: bool
    progress: bool
    task: str = "node"
    """``--task``: a link import takes an input's own edge split where it has one (``ImportSource.link_split``)."""


@dataclass(frozen=True)
class ImportSource:
    """A readable input graph.

    labels: (N,) int64 from ``normalize_labels``; split: the input's own split in input form
    (checked by ``write_dataset``) or None, with split_origins naming its three files.
    edges / features: callables returning a fresh generator of ``(src, dst)`` chunks in input
    order / of feature row chunks in node order; edge_origin / feature_origin name the files
    in error messages. num_edges: for progress; None when unknown (the reader reports its own).
    provenance: extra fields for the raw header's ``source``.
    """

    num_nodes: int
    feat_dim: int
    labels: np.ndarray
    split: SplitArrays | None
    split_origins: tuple[str, str, str]
    edges: Callable[[], Generator[tuple[np.ndarray, np.ndarray], None, None]]
    edge_origin: str
    num_edges: int | None
    features: Callable[[], Generator[np.ndarray, None, None]]
    feature_origin: str
    provenance: dict[str, Any] = field(default_factory=dict)
    link_split: GivenLinkSplit | None = None
    """The input's own edge split (a link import of an OGB link-property directory); None: ``--task link`` splits
    the pairs itself."""


def one_line(err: BaseException) -> str:
    """The first line of an exception's message, for a one-line UserError."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def normalize_labels(values: np.ndarray, origin: str) -> np.ndarray:
    """Labels as int64 with -1 for unlabeled.

    Accepts integers, integral floats (NaN means unlabeled), an (N, 1) column, or an (N, C)
    one-hot matrix (an all-zero row means unlabeled; a row with several ones is multi-label,
    which megabatch does not support, so it is an error rather than a silent argmax).
    """
    arr = np.asarray(values)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.dtype.kind not in "biuf":
        raise UserError(f"{origin}: labels have dtype {arr.dtype}, expected integers")
    if arr.ndim == 2:
        ones = arr == 1
        if not (ones | (arr == 0)).all():
            raise UserError(f"{origin}: 2-D labels must be one-hot (only 0 and 1), shape {arr.shape}")
        count = ones.sum(axis=1)
        if (count > 1).any():
            row = int(np.flatnonzero(count > 1)[0])
            raise UserError(f"{origin}: node {row} has {int(count[row])} labels; multi-label data is "
                            "not supported")
        return np.where(count == 1, np.argmax(ones, axis=1), -1).astype(np.int64)
    if arr.ndim != 1:
        raise UserError(f"{origin}: labels have shape {arr.shape}, expected (N,) or one-hot (N, C)")
    if arr.dtype.kind == "f":
        unlabeled = np.isnan(arr)
        filled = np.where(unlabeled, -1.0, arr)
        bad = ~np.isfinite(filled) | (filled != np.floor(filled)) | (np.abs(filled) >= 2.0 ** 53)
        if bad.any():
            node = int(np.flatnonzero(bad)[0])
            raise UserError(f"{origin}: label {float(arr[node])!r} of node {node} is not an integer")
        arr = filled
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise UserError(f"{origin}: label {int(arr.max())} does not fit in int64")
    labels = arr.astype(np.int64)
    if labels.size and labels.min() < -1:
        node = int(np.flatnonzero(labels < -1)[0])
        raise UserError(f"{origin}: label {int(labels[node])} of node {node} is negative "
                        "(only -1, meaning unlabeled, is allowed)")
    return labels


def split_from_mask(mask: np.ndarray, origin: str, num_nodes: int) -> np.ndarray:
    """Node ids of a boolean (or 0/1) node mask of length N."""
    arr = np.asarray(mask)
    if arr.shape != (num_nodes,):
        raise UserError(f"{origin}: mask shape {arr.shape}, expected ({num_nodes},)")
    if arr.dtype != np.bool_ and not (arr.dtype.kind in "iu" and ((arr == 0) | (arr == 1)).all()):
        raise UserError(f"{origin}: a split mask must be boolean (or 0/1), got dtype {arr.dtype}")
    return np.flatnonzero(arr).astype(np.int64)


def _check_split(split: SplitArrays, origins: tuple[str, str, str], labels: np.ndarray) -> SplitArrays:
    """Deduplicate each part (first occurrence wins, order kept) and check range, labels, disjointness."""
    n = len(labels)
    owner = np.full(n, -1, dtype=np.int8)
    parts = []
    for k, (ids, origin) in enumerate(zip(split, origins)):
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise UserError(f"{origin}: split must be a 1-D array of integer node ids, "
                            f"got {arr.dtype} {arr.shape}")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
            bad = int(np.flatnonzero((arr < 0) | (arr >= n))[0])
            raise UserError(f"{origin}: node id {int(arr[bad])} (entry {bad}) is outside [0, {n})")
        arr = arr.astype(np.int64)
        _, first = np.unique(arr, return_index=True)
        arr = arr[np.sort(first)]
        unlabeled = labels[arr] < 0
        if unlabeled.any():
            raise UserError(f"{origin}: node {int(arr[unlabeled][0])} is in the {SPLIT_NAMES[k]} split "
                            "but has no label (-1)")
        clash = owner[arr] >= 0
        if clash.any():
            node = int(arr[clash][0])
            raise UserError(f"{origin}: node {node} is also in the {SPLIT_NAMES[owner[node]]} split "
                            f"({origins[owner[node]]}); splits must be disjoint")
        owner[arr] = k
        parts.append(arr)
    return parts[0], parts[1], parts[2]


def _choose_split(data: ImportSource, options: ImportOptions) -> tuple[SplitArrays, dict[str, Any]]:
    if data.split is not None and not options.force_split:
        return _check_split(data.split, data.split_origins, data.labels), {"origin": "input"}
    split = stratified_split(data.labels, options.split, options.split_seed)
    return split, {"origin": "stratified", "ratios": [float(r) for r in options.split],
                   "seed": options.split_seed}


def _copy_edges(writer: RawDatasetWriter, data: ImportSource, options: ImportOptions, progress: bool) -> None:
    n = data.num_nodes
    seen = 0
    with Progress("import edges", data.num_edges or 0, "edges", enabled=progress and data.num_edges is not None
                  ) as bar, closing(data.edges()) as chunks:
        for src_chunk, dst_chunk in chunks:
            src = np.asarray(src_chunk, dtype=np.int64)
            dst = np.asarray(dst_chunk, dtype=np.int64)
            if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
                bad = int(np.flatnonzero((src < 0) | (src >= n) | (dst < 0) | (dst >= n))[0])
                raise UserError(f"{data.edge_origin}: edge {seen + bad} ({int(src[bad])} -> {int(dst[bad])}) "
                                f"has a node id outside [0, {n})")
            seen += len(src)
            if options.drop_self_loops:
                keep = src != dst
                src, dst = src[keep], dst[keep]
            writer.append_edges(src, dst)
            bar.update(len(src_chunk))


def _sort_edges(writer: RawDatasetWriter, num_nodes: int, options: ImportOptions, budget: int,
                progress: bool) -> None:
    """Rewrite the stored edges sorted by (src, dst), symmetrized and/or deduplicated, out of core."""
    writer.finish_edges()
    src_path, dst_path = writer.edge_paths
    # undirected doubles every chunk before the sort distributes it
    rows = rows_per_chunk(DISTRIBUTE_BYTES_PER_EDGE * (2 if options.undirected else 1), budget)

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        with NpyReader(src_path, expect_dtype="int64", expect_ndim=1) as srcs, \
                NpyReader(dst_path, expect_dtype="int64", expect_ndim=1) as dsts:
            for start in range(0, srcs.nrows, rows):
                src, dst = srcs.read(start, start + rows), dsts.read(start, start + rows)
                if options.undirected:
                    # a self-loop is its own reverse; adding it again would only duplicate it
                    loop = src == dst
                    src, dst = np.concatenate((src, dst[~loop])), np.concatenate((dst, src[~loop]))
                yield src, dst

    sorted_src, sorted_dst = writer.scratch / "sorted_src.npy", writer.scratch / "sorted_dst.npy"
    with NpyWriter(sorted_src, "int64") as out_src, NpyWriter(sorted_dst, "int64") as out_dst:
        for bucket in external_sort_edges(chunks, num_nodes, writer.scratch, budget, dedup=options.dedup,
                                          progress=progress, step="import: sort edges"):
            out_src.append(bucket.primary)
            out_dst.append(bucket.secondary)
    writer.replace_edges(sorted_src, sorted_dst)


def _copy_features(writer: RawDatasetWriter, data: ImportSource, feat_dtype: str, progress: bool) -> None:
    n, dim, origin = data.num_nodes, data.feat_dim, data.feature_origin
    row = 0
    with Progress("import features", n, "rows", enabled=progress) as bar, \
            closing(data.features()) as chunks:
        for chunk in chunks:
            if chunk.ndim != 2 or chunk.shape[1] != dim:
                raise UserError(f"{origin}: rows from {row} have shape {chunk.shape[1:]}, expected ({dim},)")
            if row + len(chunk) > n:
                raise UserError(f"{origin}: more than {n} feature rows; expected one per node")
            if chunk.dtype.kind not in "biuf":
                raise UserError(f"{origin}: features have dtype {chunk.dtype}, expected floats")
            with np.errstate(over="ignore"):  # overflow to inf is reported below, by row
                out = chunk.astype(feat_dtype, copy=False)
            finite = np.isfinite(out).all(axis=1)
            if not finite.all():
                bad = int(np.flatnonzero(~finite)[0])
                what = ("NaN or infinite values" if not np.isfinite(chunk[bad]).all()
                        else f"values too large for {feat_dtype}")
                raise UserError(f"{origin}: feature row {row + bad} has {what}")
            writer.append_features(out)
            row += len(chunk)
            bar.update(len(chunk))
    if row != n:
        raise UserError(f"{origin}: {row} feature rows, expected {n} (one per node)")


def write_dataset(data: ImportSource, out: Path, *, fmt: str, src: Path, options: ImportOptions,
                  memory_budget: int, progress: bool) -> RawDataset:
    """Validate ``data`` chunk by chunk and publish it as a raw dataset at ``out``."""
    if len(data.labels) != data.num_nodes:
        raise UserError(f"{src}: {len(data.labels)} labels for {data.num_nodes} nodes")
    split, split_info = _choose_split(data, options)
    num_classes = max(1, int(data.labels.max()) + 1 if data.labels.size else 1)
    source = {"importer": fmt, "input": str(src), "options": options.to_json(), "split": split_info,
              **data.provenance}
    try:
        with RawDatasetWriter(out, num_nodes=data.num_nodes, feat_dim=data.feat_dim, num_classes=num_classes,
                              feat_dtype=options.feat_dtype, source=source) as writer:
            _copy_edges(writer, data, options, progress)
            if options.rewrites_edges:
                _sort_edges(writer, data.num_nodes, options, memory_budget, progress)
            if options.task == "link" and data.link_split is not None:
                write_given_split(writer, data.num_nodes, data.link_split, seed=options.edge_split_seed,
                                  eval_negatives=options.eval_negatives, undirected=options.undirected,
                                  budget=memory_budget, progress=progress)
            elif options.task == "link":
                split_link_edges(writer, data.num_nodes, ratios=options.edge_split, seed=options.edge_split_seed,
                                 eval_negatives=options.eval_negatives, undirected=options.undirected,
                                 budget=memory_budget, progress=progress)
            _copy_features(writer, data, options.feat_dtype, progress)
            writer.write_labels(data.labels)
            writer.write_split(*split)
    except OSError as err:
        # the writer has already removed its temporary directory; a full disk is the usual cause
        raise io_error(err, f"importing {src} into {out}") from err
    return open_raw(out)
