"""``megabatch verify``: checksums plus the structural invariants of docs/FORMAT.md.

Every check streams in bounded chunks; per-node arrays (N int64) are the only whole reads.
``verify_dataset`` returns the list of problems (empty means valid) instead of stopping at
the first, so one run reports everything wrong with a damaged dataset.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loader.format.dataset import (
    CHECK_FILES,
    FEATURE_ALIGNMENT,
    FILES,
    LINK_FILES,
    Dataset,
    manifest_text,
    open_dataset,
)
from loader.format.fileio import file_xxh3
from loader.format.npyio import NpyReader, read_npy, rows_per_chunk
from loader.format.partition_table import PARTITION_COLUMNS
from loader.format.read_checks import PAGE_BYTES, file_block_checksums, partition_checksum_table
from loader.offline.verify_link import check_link
from proto.errors import UserError
from proto.progress import Progress
from proto.sizes import counted

__all__ = ["VerifyReport", "verify_dataset"]

_CHUNK_BYTES = 64 << 20


@dataclass
class VerifyReport:
    """Problems found (human-readable, one line each) and the names of checks that ran."""

    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_dataset(path: Path | str, *, progress: bool = True) -> VerifyReport:
    """Verify the dataset at ``path``; raises UserError only if it cannot be opened at all."""
    dataset = open_dataset(path)
    report = VerifyReport()
    _check_manifest_bytes(dataset, report)
    _check_checksums(dataset, report, progress)
    if report.problems:
        return report  # structure checks on corrupt files would only repeat the same problem
    steps: list[tuple[str, Callable[[Dataset], list[str]]]] = [
        ("csc", _check_csc), ("partitions", _check_partitions), ("features", _check_features),
        ("labels and splits", _check_labels_and_splits), ("permutations", _check_permutations),
        ("static cache", _check_static_cache), ("read checks", _check_read_checks),
    ]
    if dataset.manifest.link is not None:
        steps.append(("link", check_link))
    for name, check in steps:
        try:
            problems = check(dataset)
        except UserError as err:
            problems = [str(err)]
        report.checks.append(name)
        report.problems.extend(f"{name}: {p}" for p in problems)
    return report


def _check_manifest_bytes(dataset: Dataset, report: VerifyReport) -> None:
    report.checks.append("manifest")
    text = (dataset.path / "manifest.json").read_text()
    if text != manifest_text({k: v for k, v in json.loads(text).items() if k != "checksum"}):
        report.problems.append("manifest: manifest.json is not byte-identical to its canonical form")
    required = set(FILES.values())
    if _minor_version(dataset) >= 1:
        required |= set(dataset.manifest.check_files)  # format 1.1 adds the read checks
    if dataset.manifest.link is not None:
        required |= set(LINK_FILES.values())
    missing = sorted(required - set(dataset.manifest.files))
    if missing:
        report.problems.append(f"manifest: no checksum recorded for {', '.join(missing)}")


def _minor_version(dataset: Dataset) -> int:
    try:
        return int(dataset.manifest.version.split(".")[1])
    except (IndexError, ValueError):
        return 0


def _check_checksums(dataset: Dataset, report: VerifyReport, progress: bool) -> None:
    report.checks.append("checksums")
    entries = dataset.manifest.files
    damaged: list[str] = []
    unlike: dict[int, str] = {}  # place in the problems -> a file whose content does not match
    with Progress("verify checksums", len(entries), "files", enabled=progress) as bar:
        for name, entry in sorted(entries.items()):
            path = dataset.path / name
            if not path.is_file():
                report.problems.append(f"checksums: {name} is missing")
                damaged.append(name)
            elif path.stat().st_size != entry.bytes:
                report.problems.append(f"checksums: {name} has {path.stat().st_size} bytes, manifest says "
                                       f"{entry.bytes}")
                damaged.append(name)
            elif file_xxh3(path) != entry.xxh3_64:
                damaged.append(name)
                unlike[len(report.problems)] = name
                report.problems.append("")
            bar.update()
    # named once every file is checked: a damaged block table would point at the wrong block
    for place, name in unlike.items():
        report.problems[place] = (f"checksums: {name} content does not match its xxh3_64"
                                  f"{_where_damaged(dataset, name, damaged)}")


def _where_damaged(dataset: Dataset, name: str, damaged: list[str]) -> str:
    """Where the file ``name`` differs from its block checksums (format 1.1+: ``features.bin`` and
    ``indices.npy``): its first differing block as a byte range, or "" where it has no sound table."""
    m = dataset.manifest
    tables = {FILES["features"]: (m.feature_check_file, m.feature_check_bytes),
              FILES["indices"]: (CHECK_FILES["index_pages"], PAGE_BYTES)}
    if not m.has_read_checks or name not in tables:
        return ""
    table, block = tables[name]
    if table in damaged:
        return f" (its block checksums, {table}, are damaged too: no block named)"
    stored = read_npy(dataset.path / table, expect_dtype=np.uint64, expect_ndim=1)
    path = dataset.path / name
    found = file_block_checksums(path, block)
    if len(stored) != len(found):
        return ""
    bad = np.flatnonzero(stored != found)
    if not len(bad):
        return ""
    first = int(bad[0]) * block
    last = min(first + block, path.stat().st_size) - 1
    return (f": the first damaged block is bytes {first} to {last} ({counted(len(bad), 'block')} of {block} bytes "
            f"differ from {table})")


def _check_csc(dataset: Dataset) -> list[str]:
    m = dataset.manifest
    indptr = dataset.read("indptr", "int64", 1)
    problems = []
    if len(indptr) != m.num_nodes + 1:
        return [f"indptr has {len(indptr)} entries, expected {m.num_nodes + 1}"]
    if indptr[0] != 0 or indptr[-1] != m.num_edges:
        problems.append(f"indptr must run from 0 to {m.num_edges}, runs {indptr[0]}..{indptr[-1]}")
    if (np.diff(indptr) < 0).any():
        problems.append("indptr is not monotone")
    with NpyReader(dataset.file("indices"), expect_dtype=m.index_dtype.value, expect_ndim=1) as reader:
        if reader.nrows != m.num_edges:
            problems.append(f"indices has {reader.nrows} entries, expected {m.num_edges}")
        for start, ids in reader.chunks(rows_per_chunk(8, _CHUNK_BYTES)):
            if ids.size and (ids.min() < 0 or ids.max() >= m.num_nodes):
                problems.append(f"indices[{start}:{start + len(ids)}] holds ids outside [0, {m.num_nodes})")
                break
    return problems


def _check_partitions(dataset: Dataset) -> list[str]:
    m = dataset.manifest
    shape = dataset.read("partitions", "int64", 2).shape
    if shape != (m.num_partitions, len(PARTITION_COLUMNS)):
        return [f"partitions.npy has shape {shape}, expected ({m.num_partitions}, {len(PARTITION_COLUMNS)})"]
    parts = dataset.partitions()
    node_begin, node_end, edge_begin, edge_end = parts.node_begin, parts.node_end, parts.edge_begin, parts.edge_end
    offset, nbytes = parts.feat_offset, parts.feat_nbytes
    problems = []
    if node_begin[0] != 0 or node_end[-1] != m.num_nodes or (node_begin[1:] != node_end[:-1]).any():
        problems.append("partition node ranges are not contiguous from 0 to num_nodes")
    if (node_end < node_begin).any():
        problems.append("a partition has node_end < node_begin")
    indptr = dataset.read("indptr", "int64", 1)
    if len(indptr) == m.num_nodes + 1 and not problems and (
            (edge_begin != indptr[node_begin]).any() or (edge_end != indptr[node_end]).any()):
        problems.append("partition edge ranges disagree with indptr")
    if (offset % FEATURE_ALIGNMENT).any():
        problems.append(f"a partition's features do not start on a {FEATURE_ALIGNMENT}-byte boundary")
    if (nbytes != (node_end - node_begin) * m.row_bytes).any():
        problems.append("a partition's feature byte length disagrees with its node count")
    if (offset[1:] < offset[:-1] + nbytes[:-1]).any():
        problems.append("partition feature ranges overlap")
    size = dataset.file("features").stat().st_size
    if len(offset) and offset[-1] + nbytes[-1] > size:
        problems.append(f"features.bin ({size} bytes) ends before the last partition")
    return problems


def _check_features(dataset: Dataset) -> list[str]:
    """Every feature row is finite (reads each partition's bytes once, in order); 8-bit codes are, and their
    column ranges must be well formed."""
    m = dataset.manifest
    if dataset.feature_codec() is not None:
        return []  # every uint8 is a code; feature_codec() raised a UserError for a bad range table
    dtype = np.dtype(m.feat_dtype.value)
    parts = dataset.partitions()
    rows_per_read = rows_per_chunk(m.row_bytes, _CHUNK_BYTES)
    with open(dataset.file("features"), "rb") as handle:
        for p, part in enumerate(parts.rows()):
            begin, end, offset = part.node_begin, part.node_end, part.feat_offset
            for first in range(begin, end, rows_per_read):
                count = min(rows_per_read, end - first)
                handle.seek(offset + (first - begin) * m.row_bytes)
                block = np.frombuffer(handle.read(count * m.row_bytes), dtype=dtype)
                if block.size != count * m.feat_dim:
                    return [f"features.bin is truncated inside partition {p}"]
                if not np.isfinite(block).all():
                    return [f"partition {p} has NaN or infinite features"]
    return []


def _check_labels_and_splits(dataset: Dataset) -> list[str]:
    m = dataset.manifest
    labels = dataset.read("labels", "int64", 1)
    problems = []
    if len(labels) != m.num_nodes:
        problems.append(f"labels has {len(labels)} entries, expected {m.num_nodes}")
    if ((labels < -1) | (labels >= m.num_classes)).any():
        problems.append(f"labels outside [-1, {m.num_classes})")
    seen = np.zeros(m.num_nodes, dtype=bool)
    for name in ("train", "val", "test"):
        ids = dataset.read(name, "int64", 1)
        if ids.size and (ids.min() < 0 or ids.max() >= m.num_nodes):
            problems.append(f"{name} split has ids outside [0, {m.num_nodes})")
            continue
        if (np.diff(ids) <= 0).any():
            problems.append(f"{name} split is not sorted and duplicate-free")
        if seen[ids].any():
            problems.append(f"{name} split overlaps another split")
        seen[ids] = True
        if m.splits.of(name) != len(ids):
            problems.append(f"{name} split has {len(ids)} ids, manifest says {m.splits.of(name)}")
    return problems


def _is_permutation(values: np.ndarray, n: int) -> bool:
    if len(values) != n or (values.size and (values.min() < 0 or values.max() >= n)):
        return False
    return bool((np.bincount(values, minlength=n) == 1).all())


def _check_permutations(dataset: Dataset) -> list[str]:
    n = dataset.manifest.num_nodes
    problems = []
    for name in ("new_to_orig", "neighbor_rank"):
        if not _is_permutation(dataset.read(name, "int64", 1), n):
            problems.append(f"{FILES[name]} is not a permutation of 0..{n - 1}")
    return problems


def _check_static_cache(dataset: Dataset) -> list[str]:
    """Static ids valid and each stored list equals the node's list in the CSC."""
    m = dataset.manifest
    static = dataset.read("static_nodes", "int64", 1)
    problems = []
    if len(static) != m.static_cache.num_nodes:
        problems.append(f"{len(static)} static nodes, manifest says {m.static_cache.num_nodes}")
    if static.size and (static.min() < 0 or static.max() >= m.num_nodes or (np.diff(static) <= 0).any()):
        return problems + ["static_nodes must be sorted, unique ids in range"]
    with NpyReader(dataset.file("static_features")) as reader:
        if reader.shape != (len(static), m.feat_dim):
            problems.append(f"static_features has shape {reader.shape}, expected ({len(static)}, {m.feat_dim})")
    indptr = dataset.read("indptr", "int64", 1)
    static_indptr = dataset.read("static_indptr", "int64", 1)
    if len(static_indptr) != len(static) + 1 or (np.diff(static_indptr) != np.diff(indptr)[static]).any():
        return problems + ["static_indptr disagrees with the CSC degrees of the static nodes"]
    if not static.size:
        return problems
    # Static nodes are scattered across the CSC, so gather their lists through a read-only map,
    # a bounded group of static nodes at a time.
    indices = np.load(dataset.file("indices"), mmap_mode="r")
    with NpyReader(dataset.file("static_indices")) as copies:
        group_edges = rows_per_chunk(16, _CHUNK_BYTES)
        cuts = np.searchsorted(static_indptr, np.arange(0, int(static_indptr[-1]), group_edges), side="right") - 1
        bounds = np.unique(np.concatenate((cuts, [len(static)])))
        for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            counts = np.diff(static_indptr[first:last + 1])
            within = np.arange(int(counts.sum())) - np.repeat(static_indptr[first:last] - static_indptr[first], counts)
            picks = np.repeat(indptr[static[first:last]], counts) + within
            stored = copies.read(int(static_indptr[first]), int(static_indptr[last]))
            if not np.array_equal(np.asarray(indices[picks]), stored):
                problems.append(f"static edge lists of static nodes {first}..{last - 1} differ from the CSC")
                break
    return problems


def _check_read_checks(dataset: Dataset) -> list[str]:
    """The read checks (format 1.1, 1.2) agree with the files they check: recomputed, not trusted."""
    if not dataset.manifest.has_read_checks:
        return []
    problems = []
    stored = dataset.path / CHECK_FILES["partition_checksums"]
    if not np.array_equal(read_npy(stored), partition_checksum_table(dataset.path, dataset.partitions(), FILES)):
        problems.append(f"{stored.name} disagrees with the partition ranges it checks")
    m = dataset.manifest
    for name, data_file, block in ((m.feature_check_file, "features", m.feature_check_bytes),
                                   (CHECK_FILES["index_pages"], "indices", PAGE_BYTES)):
        stored = dataset.path / name
        if not np.array_equal(read_npy(stored), file_block_checksums(dataset.file(data_file), block)):
            problems.append(f"{stored.name} disagrees with the {block}-byte blocks of {FILES[data_file]}")
    return problems
