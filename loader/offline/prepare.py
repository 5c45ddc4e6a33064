"""``megabatch prepare``: turn a raw dataset into the partition-contiguous format (docs/FORMAT.md).

Steps, each within ``memory_budget`` plus a fixed interpreter overhead:
validate raw files -> degrees -> (symmetric CSR on disk) -> partition -> renumber ->
CSC + static lists -> features -> (link files, ``link_prepare``) -> labels, splits, rankings -> read
checks (per partition and per page) -> file checksums -> manifest -> rename.
Per-node arrays (``NODE_STATE_BYTES`` per node) are charged to the budget up front.
"""

import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import loader
from loader.format.dataset import (
    CHECK_FILES,
    CODEC_FILES,
    CODES_FORMAT_VERSION,
    FEATURE_ALIGNMENT,
    FILES,
    FORMAT_VERSION,
    LINK_FILES,
    LINK_FORMAT_VERSION,
    STORED_DTYPES,
    Dataset,
    FeatureDtype,
    FileEntry,
    IndexDtype,
    Manifest,
    manifest_text,
    open_dataset,
)
from loader.format.feature_codec import RANGE_FILE, ColumnRange, FeatureCodec
from loader.format.fileio import file_xxh3, write_all
from loader.format.link import MAX_LINK_PARTITIONS
from loader.format.manifest_tables import EdgeCut, NeighborRankInfo, PartitionerInfo, SplitSizes, StaticCacheInfo
from loader.format.npyio import NpyReader, NpyWriter, read_npy, rows_per_chunk, write_npy
from loader.format.partition_count import auto_partitions
from loader.format.partition_table import PartitionTable
from loader.format.raw import SPLIT_NAMES, RawDataset, iter_edge_chunks, open_raw, read_split_ids, validate_raw
from loader.format.read_checks import write_read_checks
from loader.format.splits import stratified_split
from loader.offline.extsort import DISTRIBUTE_BYTES_PER_EDGE, external_sort_edges
from loader.offline.layout import Renumbering, write_features, write_structure
from loader.offline.link_prepare import bucket_table_bytes, write_link_files
from loader.offline.partition import SymmetricAdjacency, make_partitioner
from proto.atomic import atomic_directory, io_error
from proto.errors import UserError
from proto.progress import Progress
from proto.sizes import format_size

__all__ = ["PrepareOptions", "prepare_dataset", "NODE_STATE_BYTES", "MIN_CHUNK_BUDGET", "FIXED_OVERHEAD_BYTES"]

log = logging.getLogger("megabatch")

NODE_STATE_BYTES = 80
"""Bytes per node held for the whole run: partition id, both id maps, degrees, masks, sort counts."""

MIN_CHUNK_BUDGET = 16 << 20
"""Smallest budget left for streaming chunks after per-node state; below it, refuse."""

FIXED_OVERHEAD_BYTES = 192 << 20
"""What peak RSS may exceed ``memory_budget`` by: the interpreter with numpy and pymetis
(~95 MiB measured), numba's LLVM once a kernel runs (+44 MiB), and allocator slack. Checked by
tests/loader/offline/test_memory_bound.py and bench/prepare_bench.py."""


@dataclass(frozen=True)
class PrepareOptions:
    """Options of ``megabatch prepare``.

    num_partitions: P (>= 1, <= N); None (the default): ``auto_partitions`` of the graph.
    partitioner: ``metis`` (default), ``stream`` or ``random``.
    memory_budget: bytes for data (default 1 GiB); the interpreter's fixed overhead comes on top.
    static_ratio: fraction of nodes in the static cache (default 0.01). feat_dtype: ``float32``,
    ``float16`` or ``uint8`` (per-column 8-bit codes, ``loader.format.feature_codec``); None keeps the raw
    dtype. seed: partitioner seed (default 0).
    """

    num_partitions: int | None = None
    partitioner: str = "metis"
    memory_budget: int = 1 << 30
    static_ratio: float = 0.01
    feat_dtype: str | None = None
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.num_partitions is not None and self.num_partitions < 1:
            raise UserError(f"--partitions must be >= 1, got {self.num_partitions}")
        if not 0.0 <= self.static_ratio <= 1.0:
            raise UserError(f"--static-ratio must lie in [0, 1], got {self.static_ratio}")
        if self.feat_dtype not in (None, *STORED_DTYPES):
            raise UserError(f"--feat-dtype must be one of {', '.join(STORED_DTYPES)}, got {self.feat_dtype!r}")
        make_partitioner(self.partitioner)


def prepare_dataset(raw_path: Path | str, out: Path | str, options: PrepareOptions) -> Dataset:
    """Prepare ``raw_path`` into a new dataset directory ``out`` (which must not exist)."""
    started = time.monotonic()
    if Path(out).exists():  # fail before minutes of validation, not after
        raise UserError(f"output {out} already exists; choose a new path or remove it first")
    raw = open_raw(raw_path)
    head = raw.header
    n = head.num_nodes
    out_dtype = np.dtype(options.feat_dtype or head.feat_dtype)
    num_partitions = options.num_partitions
    if num_partitions is None:
        num_partitions = auto_partitions(n, n * head.feat_dim * out_dtype.itemsize)
        log.info("--partitions auto: %d (docs/FORMAT.md, \"Partitions\")", num_partitions)
    if head.link is not None and num_partitions > MAX_LINK_PARTITIONS:
        if options.num_partitions is not None:
            raise UserError(f"--partitions {num_partitions}: a link dataset has at most {MAX_LINK_PARTITIONS} "
                            f"(edge_buckets.npy holds P*P + 1 offsets)")
        log.info("--partitions auto: %d for a link dataset (at most %d)", MAX_LINK_PARTITIONS, MAX_LINK_PARTITIONS)
        num_partitions = MAX_LINK_PARTITIONS
    if num_partitions > n:
        raise UserError(f"--partitions {num_partitions} exceeds the {n} nodes of {raw.path}")
    held = NODE_STATE_BYTES * n + (bucket_table_bytes(num_partitions) if head.link is not None else 0)
    budget = options.memory_budget - held
    if budget < MIN_CHUNK_BUDGET:
        need = held + MIN_CHUNK_BUDGET
        raise UserError(f"--memory-budget {format_size(options.memory_budget)} is too small for {n} nodes; "
                        f"prepare needs at least {format_size(need)}")
    partitioner = make_partitioner(options.partitioner, options.seed)
    partitioner.check_memory(n, head.num_edges, budget)
    log.info("prepare %s: %d nodes, %d edges, %d partitions (%s), %s for streaming chunks",
             raw.path, n, head.num_edges, num_partitions, partitioner.name, format_size(budget))
    validate_raw(raw, budget, progress=options.progress)
    index_dtype = np.dtype(np.int32 if n < 2**31 else np.int64)
    try:
        with atomic_directory(Path(out)) as tmp:
            scratch = tmp / "scratch"
            scratch.mkdir()
            in_deg, out_deg = _degrees(raw, budget)
            t0 = time.monotonic()
            adjacency = _symmetric_adjacency(raw, scratch, budget, options.progress) \
                if partitioner.needs_adjacency else None
            part = partitioner.partition(n, num_partitions, adjacency, budget, options.progress)
            partition_seconds = time.monotonic() - t0
            for path in scratch.iterdir():
                path.unlink()
            renumbering = Renumbering.from_parts(part, num_partitions)
            del part
            in_new, out_new = in_deg[renumbering.new_to_orig], out_deg[renumbering.new_to_orig]
            del in_deg, out_deg
            static_count = min(n, math.ceil(options.static_ratio * n))
            static_nodes = _static_nodes(in_new, out_new, static_count)
            write_npy(tmp / FILES["neighbor_rank"], _neighbor_rank(in_new, out_new))
            indptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(in_new, out=indptr[1:])
            del in_new, out_new
            cut_edges = write_structure(raw, renumbering, indptr, static_nodes, tmp, scratch, budget, index_dtype,
                                        options.progress)
            codec = None
            if out_dtype == np.uint8:
                codec = column_range(raw, budget, options.progress)
                write_npy(tmp / RANGE_FILE, codec.table())
            offsets, nbytes = write_features(raw, renumbering, static_nodes, tmp, scratch, budget, out_dtype,
                                             options.progress, codec)
            if head.link is not None:
                write_link_files(raw, renumbering, tmp, scratch, budget, options.progress)
            scratch.rmdir()
            partitions = PartitionTable(np.stack([renumbering.node_begin, renumbering.node_end,
                                                  indptr[renumbering.node_begin], indptr[renumbering.node_end],
                                                  offsets, nbytes], axis=1))
            del indptr
            write_npy(tmp / FILES["partitions"], partitions.array)
            write_npy(tmp / FILES["new_to_orig"], renumbering.new_to_orig)
            write_npy(tmp / FILES["static_nodes"], static_nodes)
            splits = _write_labels_and_splits(raw, renumbering, tmp)
            feature_block = write_read_checks(tmp, partitions, FILES, row_bytes=head.feat_dim * out_dtype.itemsize,
                                              progress=options.progress)
            files = _checksums(tmp, options.progress, link=head.link is not None, coded=codec is not None)
            manifest = Manifest(
                version=CODES_FORMAT_VERSION if codec is not None else FORMAT_VERSION if head.link is None
                else LINK_FORMAT_VERSION, num_nodes=n,
                num_edges=head.num_edges,
                num_partitions=num_partitions, num_classes=head.num_classes, feat_dim=head.feat_dim,
                feat_dtype=FeatureDtype(out_dtype.name), index_dtype=IndexDtype(index_dtype.name),
                feature_alignment=FEATURE_ALIGNMENT, feature_check_block=feature_block,
                partitioner=PartitionerInfo(partitioner.name, partitioner.params(), round(partition_seconds, 3)),
                edge_cut=EdgeCut(cut_edges, cut_edges / head.num_edges if head.num_edges else 0.0),
                static_cache=StaticCacheInfo(options.static_ratio, int(static_count), "in_degree + out_degree"),
                neighbor_rank=NeighborRankInfo("out_degree / in_degree (in_degree 0 first)"),
                splits=splits, files=files, link=head.link,
                created_by={"tool": "megabatch", "version": loader.__version__,
                            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                            "host": socket.gethostname(), "seconds": round(time.monotonic() - started, 3),
                            "memory_budget": options.memory_budget},
                source=head.source)
            fd = os.open(tmp / "manifest.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                write_all(fd, manifest_text(manifest.to_json()).encode())
            finally:
                os.close(fd)
    except OSError as err:
        raise io_error(err, f"preparing {out}") from err
    return open_dataset(out)


def column_range(raw: RawDataset, budget: int, progress: bool) -> FeatureCodec:
    """The 8-bit codes' column ranges: one streaming pass over the raw features (``feat_dtype`` uint8)."""
    head = raw.header
    span = ColumnRange(head.feat_dim)
    row = head.feat_dim * np.dtype(head.feat_dtype).itemsize
    with NpyReader(raw.features) as reader, Progress("features: column ranges", head.num_nodes, "rows",
                                                      enabled=progress) as bar:
        for start, rows in reader.chunks(rows_per_chunk(2 * row + 8, budget, minimum=64)):
            span.add(rows, start)
            bar.update(len(rows))
    return span.codec()


def _degrees(raw: RawDataset, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """In- and out-degree per original node id, one streaming pass over the edges."""
    n = raw.header.num_nodes
    in_deg = np.zeros(n, dtype=np.int64)
    out_deg = np.zeros(n, dtype=np.int64)
    for src, dst in iter_edge_chunks(raw, rows_per_chunk(32, budget, minimum=1024)):
        out_deg += np.bincount(src, minlength=n)
        in_deg += np.bincount(dst, minlength=n)
        del src, dst
    return in_deg, out_deg


def _symmetric_adjacency(raw: RawDataset, scratch: Path, budget: int, progress: bool) -> SymmetricAdjacency:
    """Write the undirected, deduplicated, self-loop-free CSR the partitioners read."""
    n = raw.header.num_nodes
    chunk_rows = rows_per_chunk(2 * DISTRIBUTE_BYTES_PER_EDGE, budget, minimum=1024)

    def both_directions():  # type: ignore[no-untyped-def]
        for src, dst in iter_edge_chunks(raw, chunk_rows):
            keep = src != dst
            src, dst = src[keep], dst[keep]
            del keep
            yield np.concatenate((src, dst)), np.concatenate((dst, src))
            del src, dst

    degree = np.zeros(n, dtype=np.int64)
    adjacency = SymmetricAdjacency(scratch / "sym_indptr.npy", scratch / "sym_indices.npy", n)
    with NpyWriter(adjacency.indices, np.int64) as indices:
        for bucket in external_sort_edges(both_directions, n, scratch, budget, dedup=True, progress=progress,
                                          step="symmetrize"):
            indices.append(bucket.secondary)
            degree[bucket.primary_begin:bucket.primary_end] = np.bincount(
                bucket.primary - bucket.primary_begin, minlength=bucket.primary_end - bucket.primary_begin)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=indptr[1:])
    write_npy(adjacency.indptr, indptr)
    return adjacency


def _static_nodes(in_new: np.ndarray, out_new: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` highest-degree nodes (ties: lower id), as sorted new ids."""
    degree = in_new + out_new
    order = np.lexsort((np.arange(len(degree)), -degree))
    return np.sort(order[:count]).astype(np.int64)


def _neighbor_rank(in_new: np.ndarray, out_new: np.ndarray) -> np.ndarray:
    """All nodes by decreasing out/in-degree ratio (Ginex §3.2); empty in-lists cost nothing, so first."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(in_new > 0, out_new / np.maximum(in_new, 1), np.inf)
    return np.argsort(-ratio, kind="stable").astype(np.int64)


def _write_labels_and_splits(raw: RawDataset, renumbering: Renumbering, tmp: Path) -> SplitSizes:
    labels = read_npy(raw.labels).astype(np.int64)
    write_npy(tmp / FILES["labels"], labels[renumbering.new_to_orig])
    generated = not raw.header.has_split
    ids: tuple[np.ndarray, ...]
    if generated:
        log.warning("%s has no split; making a seeded stratified 60/20/20 split (seed 0)", raw.path)
        ids = stratified_split(labels, (0.6, 0.2, 0.2), 0)
    else:
        ids = tuple(read_split_ids(raw.split(name)) for name in SPLIT_NAMES)
    del labels
    for name, orig in zip(SPLIT_NAMES, ids):
        write_npy(tmp / FILES[name], np.sort(renumbering.orig_to_new[orig]))
    train, val, test = (int(len(orig)) for orig in ids)
    return SplitSizes(train, val, test, generated)


def _checksums(tmp: Path, progress: bool, *, link: bool, coded: bool = False) -> dict[str, FileEntry]:
    files: dict[str, FileEntry] = {}
    names = sorted([*FILES.values(), *CHECK_FILES.values(), *(LINK_FILES.values() if link else ()),
                    *(CODEC_FILES.values() if coded else ())])
    with Progress("checksums", len(names), "files", enabled=progress) as bar:
        for name in names:
            path = tmp / name
            files[name] = FileEntry(path.stat().st_size, file_xxh3(path))
            bar.update()
    return files
