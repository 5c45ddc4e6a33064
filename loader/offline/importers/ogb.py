"""Import an OGB node-property-prediction dataset directory (for example ``ogbn_arxiv/``), or, with ``--task link``,
a link-property one (``ogbl_citation2/``) with its own edge split.

Layout (as the ``ogb`` package downloads it; ``.csv`` without ``.gz`` is accepted too)::

    DIR/raw/edge.csv.gz            "src,dst" per line, no header (directed as stored)
    DIR/raw/node-feat.csv.gz       N lines of D comma-separated floats
    DIR/raw/node-label.csv.gz      N lines, one label each; "nan" means unlabeled
    DIR/raw/num-node-list.csv.gz   optional: the node count
    DIR/split/<name>/{train,valid,test}.csv.gz   optional: one node id per line
    DIR/split/<name>/{train,valid,test}.pt       a link-property directory's split (``--task link``): torch
                                                 files (``loader.format.torch_archive``) of dicts holding
                                                 ``edge`` (E, 2) or ``source_node``/``target_node``, and for
                                                 valid and test ``target_node_neg`` (E, K), each positive's own
                                                 tails (ogbl-citation2), or ``edge_neg`` (one set for all,
                                                 ogbl-collab/ppa/ddi: tails are drawn instead, with a warning)

A link-property directory has no node labels: ``raw/num-node-list.csv.gz`` gives the node count and every node
is unlabeled. Its ``raw/edge.csv.gz`` is the training graph (OGB's); held-out pairs found there are removed.

Every file is streamed in chunks of lines; none is loaded whole except labels and split
ids, which are O(N) anyway.
"""

import contextlib
import gzip
import io
import itertools
import logging
import os
import warnings
import zlib
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np

from loader.format.npyio import rows_per_chunk
from loader.format.torch_archive import read_tensors
from loader.offline.importers.common import ImportReadRequest, ImportSource, normalize_labels, one_line
from loader.offline.link_split import GivenLinkSplit
from proto.errors import UserError
from proto.progress import Progress

__all__ = ["read_ogb"]

log = logging.getLogger("megabatch")

# a text line as a Python str in a list plus its parsed and cast values
_BYTES_PER_ID_LINE = 160
_BYTES_PER_FEATURE_VALUE = 32
_DECODE_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError)


def _find(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.csv.gz", f"{stem}.csv"):
        if (folder / name).is_file():
            return folder / name
    return None


def _require(folder: Path, stem: str) -> Path:
    path = _find(folder, stem)
    if path is None:
        raise UserError(f"{folder}: missing {stem}.csv.gz")
    return path


@contextlib.contextmanager
def _open_text(path: Path) -> Generator[tuple[io.TextIOWrapper, io.BufferedReader], None, None]:
    """The file as text lines, and the underlying binary file (its position tracks progress)."""
    with contextlib.ExitStack() as stack:
        try:
            raw = stack.enter_context(open(path, "rb"))
        except OSError as err:
            raise UserError(f"{path}: cannot open ({err.strerror})") from None
        stream: gzip.GzipFile | io.BufferedReader = (gzip.GzipFile(fileobj=raw, mode="rb")
                                                     if path.suffix == ".gz" else raw)
        text = stack.enter_context(io.TextIOWrapper(stream, encoding="ascii", newline=None))
        yield text, raw


def _csv_chunks(path: Path, dtype: type, lines_per_chunk: int, raw_pos: list[int] | None = None
                ) -> Generator[np.ndarray, None, None]:
    """Parse ``path`` as 2-D ``dtype`` arrays of up to ``lines_per_chunk`` lines each.

    ``raw_pos``, when given, receives the compressed bytes consumed so far after each chunk.
    """
    with _open_text(path) as (text, raw):
        first = 1
        while True:
            try:
                lines = list(itertools.islice(text, lines_per_chunk))
            except _DECODE_ERRORS as err:
                raise UserError(f"{path}: cannot read after line {first - 1} ({one_line(err)})") from None
            if not lines:
                return
            try:
                with warnings.catch_warnings():
                    # blank lines only (a trailing newline) is not worth a warning
                    warnings.simplefilter("ignore", UserWarning)
                    values: np.ndarray = np.loadtxt(lines, delimiter=",", dtype=dtype, ndmin=2)
            except ValueError as err:
                raise UserError(f"{path}: lines {first}-{first + len(lines) - 1}: "
                                f"{one_line(err)}") from None
            if raw_pos is not None:
                raw_pos[0] = raw.tell()
            first += len(lines)
            if values.size:
                yield values


def _whole(path: Path, dtype: type, lines: int) -> np.ndarray:
    """A whole small file (labels, split ids) as a 2-D array, one row per non-blank line."""
    parts = list(_csv_chunks(path, dtype, lines))
    if not parts:
        return np.empty((0, 1), dtype=dtype)
    widths = sorted({part.shape[1] for part in parts})
    if len(widths) > 1:
        raise UserError(f"{path}: lines have different numbers of columns ({widths[0]} and {widths[-1]})")
    return np.concatenate(parts)


def _column(path: Path, dtype: type, lines: int) -> np.ndarray:
    """A whole single-column file as a 1-D array."""
    values = _whole(path, dtype, lines)
    if values.shape[1] != 1:
        raise UserError(f"{path}: {values.shape[1]} columns, expected one value per line")
    return values[:, 0]


def _first_line(path: Path) -> str:
    with _open_text(path) as (text, _raw):
        try:
            return text.readline().strip()
        except _DECODE_ERRORS as err:
            raise UserError(f"{path}: cannot read ({one_line(err)})") from None


def _read_split(root: Path, lines: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray],
                                                  tuple[str, str, str], str] | None:
    split_root = root / "split"
    if not split_root.is_dir():
        return None
    names = sorted(entry.name for entry in split_root.iterdir() if entry.is_dir())
    if not names:
        return None
    if len(names) > 1:
        raise UserError(f"{split_root}: several splits ({', '.join(names)}); keep one subdirectory, "
                        "or pass --force-split to make a stratified split")
    folder = split_root / names[0]
    paths = tuple(_require(folder, stem) for stem in ("train", "valid", "test"))
    train, val, test = (_column(path, np.int64, lines) for path in paths)
    return (train, val, test), (str(paths[0]), str(paths[1]), str(paths[2])), names[0]


def _positives(data: Any, path: Path) -> np.ndarray:
    """A split file's positives as int64 (2, E): OGB's ``edge`` (E, 2), or ``source_node`` and ``target_node``."""
    if not isinstance(data, dict):
        raise UserError(f"{path}: holds a {type(data).__name__}, expected the dict OGB's split files hold")
    if "edge" in data:
        edge = np.asarray(data["edge"])
        if edge.ndim != 2 or edge.shape[1] != 2:
            raise UserError(f"{path}: 'edge' has shape {edge.shape}, expected (E, 2)")
        return np.ascontiguousarray(edge.T, dtype=np.int64)
    if "source_node" in data and "target_node" in data:
        src, dst = np.asarray(data["source_node"]), np.asarray(data["target_node"])
        if src.ndim != 1 or src.shape != dst.shape:
            raise UserError(f"{path}: source_node {src.shape} and target_node {dst.shape}, expected two (E,)")
        return np.stack((src, dst)).astype(np.int64)
    if "head" in data or "relation" in data:
        raise UserError(f"{path}: a knowledge graph's split (head, relation, tail); megabatch trains homogeneous "
                        f"graphs only")
    raise UserError(f"{path}: no 'edge' and no 'source_node'/'target_node' (keys: {', '.join(map(str, data))})")


def _read_link_split(root: Path) -> GivenLinkSplit | None:
    """An OGB link-property directory's own split (``split/<name>/{train,valid,test}.pt``), or None where the
    directory has none (a node-property one: ``--task link`` then splits the pairs itself)."""
    split_root = root / "split"
    folders = sorted(p for p in split_root.iterdir() if (p / "train.pt").is_file()) if split_root.is_dir() else []
    if not folders:
        return None
    if len(folders) > 1:
        raise UserError(f"{split_root}: several link splits ({', '.join(p.name for p in folders)}); keep one")
    folder = folders[0]
    read = {name: read_tensors(folder / f"{name}.pt") for name in ("train", "valid", "test")}
    positives = {name: _positives(data, folder / f"{name}.pt") for name, data in read.items()}
    tails: dict[str, np.ndarray | None] = {}
    for name in ("valid", "test"):
        data = read[name]
        if "target_node_neg" in data:  # ogbl-citation2: each positive's own negative targets
            tails[name] = np.asarray(data["target_node_neg"], dtype=np.int64)
        else:
            tails[name] = None
            if "edge_neg" in data:
                log.warning("%s: OGB's negatives ('edge_neg') are one set of pairs for every positive, not each "
                            "positive's own tails: --eval-negatives tails per positive are drawn instead (scores "
                            "are not OGB's Hits@K)", folder / f"{name}.pt")
    return GivenLinkSplit(positives["train"], positives["valid"], positives["test"], tails["valid"], tails["test"],
                          str(folder))


def read_ogb(req: ImportReadRequest, stack: contextlib.ExitStack) -> ImportSource:
    """Open an OGB node-property-prediction directory as an ``ImportSource``."""
    del stack  # every file is opened and closed by the generator that streams it
    root = req.src
    raw_dir = root / "raw"
    if not raw_dir.is_dir():
        raise UserError(f"{root}: no raw/ directory; pass the OGB dataset root (the directory that "
                        "contains raw/ and split/)")
    edge_path = _require(raw_dir, "edge")
    feat_path = _find(raw_dir, "node-feat")
    if feat_path is None:
        raise UserError(f"{raw_dir}: missing node-feat.csv.gz; megabatch needs node features")
    id_lines = rows_per_chunk(_BYTES_PER_ID_LINE, req.memory_budget)
    count_path = _find(raw_dir, "num-node-list")
    label_path = _find(raw_dir, "node-label")
    if label_path is None and req.task == "link" and count_path is not None:
        # a link-property graph has no node labels: its nodes are unlabeled, its node count in num-node-list
        counts = _column(count_path, np.int64, 16)
        if counts.shape != (1,):
            raise UserError(f"{count_path}: {len(counts)} node types; only homogeneous graphs are supported")
        label_path, labels = count_path, np.full(int(counts[0]), -1, dtype=np.int64)
    else:
        label_path = _require(raw_dir, "node-label")
        # labels decide N up front (the writer needs it); node-feat must then have N rows
        labels = normalize_labels(_whole(label_path, np.float64, id_lines), str(label_path))
    n = len(labels)
    if count_path is not None:
        counts = _column(count_path, np.int64, 16)
        if counts.shape != (1,):
            raise UserError(f"{count_path}: {len(counts)} node types; only homogeneous graphs are supported")
        if int(counts[0]) != n:
            raise UserError(f"{label_path}: {n} labels, but {count_path.name} says {int(counts[0])} nodes")
    if n == 0:
        raise UserError(f"{label_path}: no labels, so no nodes")

    header = _first_line(feat_path)
    if not header:
        raise UserError(f"{feat_path}: empty; expected {n} lines of comma-separated features")
    dim = header.count(",") + 1
    feat_lines = rows_per_chunk(dim * _BYTES_PER_FEATURE_VALUE + _BYTES_PER_ID_LINE, req.memory_budget)

    link_split = _read_link_split(root) if req.task == "link" else None
    split = _read_split(root, id_lines) if req.want_split and link_split is None else None
    provenance = {"ogb_split": split[2]} if split is not None else {}
    if link_split is not None:
        provenance = {"ogb_link_split": link_split.origin}

    def edges() -> Generator[tuple[np.ndarray, np.ndarray], None, None]:
        pos = [0]
        with Progress("import edges", os.path.getsize(edge_path), "bytes", enabled=req.progress) as bar:
            for chunk in _csv_chunks(edge_path, np.int64, id_lines, pos):
                if chunk.shape[1] != 2:
                    raise UserError(f"{edge_path}: {chunk.shape[1]} columns, expected 'src,dst' per line")
                yield chunk[:, 0].copy(), chunk[:, 1].copy()
                bar.update(pos[0] - bar.done)

    def features() -> Generator[np.ndarray, None, None]:
        yield from _csv_chunks(feat_path, np.float64, feat_lines)

    return ImportSource(num_nodes=n, feat_dim=dim, labels=labels,
                        split=split[0] if split is not None else None,
                        split_origins=split[1] if split is not None else ("train", "valid", "test"),
                        edges=edges, edge_origin=str(edge_path), num_edges=None,
                        features=features, feature_origin=str(feat_path), provenance=provenance,
                        link_split=link_split)
