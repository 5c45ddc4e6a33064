"""Tests for ``loader.offline.importers``: round trips per format, option semantics, bad input, a real file."""

import errno
import gzip
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.format.npyio import NpyReader, read_npy
from loader.format.raw import RawDataset, RawDatasetWriter, validate_raw
from loader.format.splits import stratified_split
from loader.offline.importers import IMPORT_FORMATS, ImportOptions, import_dataset
from proto.errors import UserError
from tests.paths import SHARED_DATA

ROUND_TRIP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Graph:
    """A small input graph, with the edges in the order the written input file stores them."""

    src: np.ndarray
    dst: np.ndarray
    features: np.ndarray  # float32 (N, D)
    labels: np.ndarray  # int64 (N,), -1 unlabeled
    split: tuple[np.ndarray, np.ndarray, np.ndarray] | None

    @property
    def n(self) -> int:
        return len(self.labels)


def random_graph(seed: int, n: int, e: int, d: int, with_split: bool) -> Graph:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    # a small pool of targets makes duplicates and self-loops common
    dst = np.where(rng.random(e) < 0.3, src, rng.integers(0, n, e))
    features = rng.standard_normal((n, d)).astype(np.float32)
    features[rng.random((n, d)) < 0.4] = 0
    labels = rng.integers(-1, int(rng.integers(1, 5)), n)
    split = None
    if with_split:
        labeled = rng.permutation(np.flatnonzero(labels >= 0))
        cuts = np.sort(rng.integers(0, len(labeled) + 1, 2))
        parts = np.split(labeled, cuts)
        # repeated ids in a part are dropped by the importer, first occurrence kept
        split = (np.concatenate([parts[0], parts[0][:2]]), parts[1], parts[2])
    return Graph(src.astype(np.int64), dst.astype(np.int64), features, labels.astype(np.int64), split)


def dedup_keep_order(ids: np.ndarray) -> np.ndarray:
    seen: set[int] = set()
    out = []
    for i in ids.tolist():
        if i not in seen:
            seen.add(i)
            out.append(i)
    return np.array(out, dtype=np.int64)


def reference_edges(src: np.ndarray, dst: np.ndarray, options: ImportOptions) -> list[tuple[int, int]]:
    """The expected stored edges, computed in plain Python."""
    pairs = list(zip(src.tolist(), dst.tolist()))
    if options.drop_self_loops:
        pairs = [(s, t) for s, t in pairs if s != t]
    if options.undirected:
        pairs += [(t, s) for s, t in pairs if s != t]
    if options.dedup:
        pairs = list(set(pairs))
    if options.undirected or options.dedup:
        pairs.sort()
    return pairs


def check_raw(raw: RawDataset, graph: Graph, options: ImportOptions, fmt: str) -> None:
    head = raw.header
    assert head.num_nodes == graph.n
    assert head.feat_dim == graph.features.shape[1]
    assert head.num_classes == max(1, int(graph.labels.max()) + 1)
    assert head.feat_dtype == options.feat_dtype
    assert head.source["importer"] == fmt
    assert head.source["options"] == options.to_json()
    validate_raw(raw, 1 << 20, progress=False)

    stored = list(zip(read_npy(raw.edge_src).tolist(), read_npy(raw.edge_dst).tolist()))
    assert stored == reference_edges(graph.src, graph.dst, options)

    features = read_npy(raw.features)
    expected = graph.features.astype(options.feat_dtype)
    assert features.dtype == expected.dtype
    assert np.array_equal(features.view(f"u{expected.itemsize}"), expected.view(f"u{expected.itemsize}"))
    assert np.array_equal(read_npy(raw.labels), graph.labels)

    assert head.has_split
    got = tuple(read_npy(raw.split(name)) for name in ("train", "val", "test"))
    if graph.split is not None and not options.force_split:
        want = tuple(dedup_keep_order(part) for part in graph.split)
        assert head.source["split"] == {"origin": "input"}
    else:
        want = stratified_split(graph.labels, options.split, options.split_seed)
        assert head.source["split"]["seed"] == options.split_seed
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


# ---------------------------------------------------------------- input writers


def csr(rows: np.ndarray, cols: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row pointer, column indices and the stable order of the entries, CSR style."""
    order = np.argsort(rows, kind="stable")
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n_rows))))
    return indptr.astype(np.int64), cols[order].astype(np.int32), order


def write_npz(path: Path, graph: Graph, *, rng: np.random.Generator, dense: bool = False,
              one_hot: bool = False, **override: Any) -> Graph:
    """Write ``graph`` as gnn-benchmark npz; return it with the edges in CSR order (explicit zeros dropped)."""
    n = graph.n
    indptr, indices, order = csr(graph.src, graph.dst, n)
    weights = rng.choice(np.array([0.0, 1.0, 2.5], dtype=np.float32), len(order), p=[0.2, 0.6, 0.2])
    arrays: dict[str, Any] = {"adj_data": weights, "adj_indices": indices, "adj_indptr": indptr,
                              "adj_shape": np.array([n, n])}
    if dense:
        arrays["attr_matrix"] = graph.features
    else:
        rows, cols = np.nonzero(graph.features)
        arrays.update(attr_data=graph.features[rows, cols], attr_indices=cols.astype(np.int32),
                      attr_indptr=np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n)))),
                      attr_shape=np.array(graph.features.shape))
    if one_hot:
        classes = int(graph.labels.max()) + 1
        # at least two columns: an (N, 1) array reads as a column of class ids
        arrays["labels"] = np.where(graph.labels[:, None] == np.arange(max(2, classes)), 1, 0)
    else:
        arrays["labels"] = graph.labels
    if graph.split is not None:
        arrays.update(idx_train=graph.split[0], idx_val=graph.split[1], idx_test=graph.split[2])
    arrays.update(override)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez_compressed(path, **arrays)
    keep = weights != 0
    return Graph(graph.src[order][keep], graph.dst[order][keep], graph.features, graph.labels, graph.split)


def write_gz_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        handle.write("".join(line + "\n" for line in lines))


def write_ogb(root: Path, graph: Graph, *, split_name: str = "time", node_count: bool = False) -> None:
    raw = root / "raw"
    write_gz_lines(raw / "edge.csv.gz", [f"{s},{t}" for s, t in zip(graph.src.tolist(), graph.dst.tolist())])
    # repr of the float64 value is exact, so parsing it back gives the same float32 bits
    write_gz_lines(raw / "node-feat.csv.gz",
                   [",".join(repr(float(x)) for x in row) for row in graph.features.tolist()])
    write_gz_lines(raw / "node-label.csv.gz", ["nan" if x < 0 else str(x) for x in graph.labels.tolist()])
    if node_count:
        write_gz_lines(raw / "num-node-list.csv.gz", [str(graph.n)])
    if graph.split is not None:
        for name, ids in zip(("train", "valid", "test"), graph.split):
            write_gz_lines(root / "split" / split_name / f"{name}.csv.gz", [str(i) for i in ids.tolist()])


def write_numpy(root: Path, graph: Graph, *, masks: bool = False, edge_dtype: str = "int64") -> None:
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "edge_index.npy", np.stack([graph.src, graph.dst]).astype(edge_dtype))
    np.save(root / "features.npy", graph.features)
    np.save(root / "labels.npy", graph.labels)
    if graph.split is not None:
        for name, ids in zip(("train", "val", "test"), graph.split):
            if masks:
                mask = np.zeros(graph.n, dtype=bool)
                mask[ids] = True
                np.save(root / f"{name}_mask.npy", mask)
            else:
                np.save(root / f"{name}_idx.npy", ids)


# ---------------------------------------------------------------- round trips

options_strategy = st.builds(
    ImportOptions, undirected=st.booleans(), drop_self_loops=st.booleans(), dedup=st.booleans(),
    split_seed=st.integers(0, 1000), force_split=st.booleans(),
    feat_dtype=st.sampled_from(["float32", "float16"]),
    split=st.sampled_from([(0.6, 0.2, 0.2), (0.5, 0.25, 0.25), (0.1, 0.1, 0.3)]))
graph_args = {"seed": st.integers(0, 2**32 - 1), "n": st.integers(1, 24), "e": st.integers(0, 70),
              "d": st.integers(1, 5), "with_split": st.booleans(), "options": options_strategy,
              "budget": st.sampled_from([160, 4096, 1 << 20])}


@pytest.mark.slow
@ROUND_TRIP
@given(dense=st.booleans(), one_hot=st.booleans(), **graph_args)
def test_npz_round_trip(seed: int, n: int, e: int, d: int, with_split: bool, options: ImportOptions,
                        budget: int, dense: bool, one_hot: bool) -> None:
    graph = random_graph(seed, n, e, d, with_split)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "g.npz"
        stored = write_npz(src, graph, rng=np.random.default_rng(seed), dense=dense, one_hot=one_hot)
        raw = import_dataset(src, Path(tmp) / "out", fmt="npz", options=options, memory_budget=budget,
                             progress=False)
        check_raw(raw, stored, options, "npz")


@pytest.mark.slow
@ROUND_TRIP
@given(split_name=st.sampled_from(["time", "sales_ranking", "random"]), node_count=st.booleans(),
       **graph_args)
def test_ogb_round_trip(seed: int, n: int, e: int, d: int, with_split: bool, options: ImportOptions,
                        budget: int, split_name: str, node_count: bool) -> None:
    graph = random_graph(seed, n, e, d, with_split)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ogbn_test"
        write_ogb(root, graph, split_name=split_name, node_count=node_count)
        raw = import_dataset(root, Path(tmp) / "out", fmt="ogb", options=options, memory_budget=budget,
                             progress=False)
        check_raw(raw, graph, options, "ogb")
        if with_split and not options.force_split:
            assert raw.header.source["ogb_split"] == split_name


@pytest.mark.slow
@ROUND_TRIP
@given(masks=st.booleans(), edge_dtype=st.sampled_from(["int64", "int32", ">i8"]), **graph_args)
def test_numpy_round_trip(seed: int, n: int, e: int, d: int, with_split: bool, options: ImportOptions,
                          budget: int, masks: bool, edge_dtype: str) -> None:
    graph = random_graph(seed, n, e, d, with_split)
    if masks and graph.split is not None:
        # a mask is a set: it carries neither order nor repeats
        graph.split = tuple(np.unique(part) for part in graph.split)  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "arrays"
        write_numpy(root, graph, masks=masks, edge_dtype=edge_dtype)
        raw = import_dataset(root, Path(tmp) / "out", fmt="numpy", options=options, memory_budget=budget,
                             progress=False)
        check_raw(raw, graph, options, "numpy")


def test_undirected_dedup_example(tmp_path: Path) -> None:
    """A hand-checked case: reverse edges added, self-loop kept once, duplicates merged, sorted."""
    graph = Graph(np.array([2, 0, 0, 1, 1]), np.array([2, 1, 1, 0, 2]), np.ones((3, 1), np.float32),
                  np.array([0, 1, 0]), None)
    write_numpy(tmp_path / "in", graph)
    raw = import_dataset(tmp_path / "in", tmp_path / "out", fmt="numpy",
                         options=ImportOptions(undirected=True, dedup=True), progress=False)
    assert read_npy(raw.edge_src).tolist() == [0, 1, 1, 2, 2]
    assert read_npy(raw.edge_dst).tolist() == [1, 0, 2, 1, 2]


def test_npz_duplicate_feature_entries_sum(tmp_path: Path) -> None:
    """Repeated (row, column) entries of a CSR matrix add up, as in scipy."""
    path = tmp_path / "g.npz"
    np.savez(path, adj_data=np.ones(1, np.float32), adj_indices=np.array([1]), adj_indptr=np.array([0, 1, 1]),
             adj_shape=np.array([2, 2]), attr_data=np.array([1.5, 2.0, 4.0], np.float32),
             attr_indices=np.array([2, 2, 0]), attr_indptr=np.array([0, 2, 3]), attr_shape=np.array([2, 3]),
             labels=np.array([0, 1]))
    raw = import_dataset(path, tmp_path / "out", fmt="npz", progress=False)
    assert read_npy(raw.features).tolist() == [[0, 0, 3.5], [4.0, 0, 0]]


# ---------------------------------------------------------------- a real file


def test_coauthor_physics(tmp_path: Path) -> None:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data not present (a user's clone)")
    path = SHARED_DATA / "coauthor-physics.npz"
    raw = import_dataset(path, tmp_path / "physics", fmt="npz", memory_budget=256 << 20, progress=False)
    head = raw.header
    assert (head.num_nodes, head.num_edges, head.feat_dim, head.num_classes) == (34493, 495924, 8415, 5)
    with np.load(path) as npz:
        indptr, indices, data = npz["attr_indptr"], npz["attr_indices"], npz["attr_data"]
        adj_indptr, adj_indices = npz["adj_indptr"], npz["adj_indices"]
        labels = npz["labels"]
    assert np.array_equal(read_npy(raw.edge_src), np.repeat(np.arange(34493), np.diff(adj_indptr)))
    assert np.array_equal(read_npy(raw.edge_dst), adj_indices)
    with NpyReader(raw.features, expect_dtype="float32") as reader:
        for start, rows in reader.chunks(2048):
            stop = start + len(rows)
            dense = np.zeros_like(rows)
            lo, hi = indptr[start], indptr[stop]
            row_of = np.repeat(np.arange(len(rows)), np.diff(indptr[start:stop + 1]))
            dense[row_of, indices[lo:hi]] = data[lo:hi]
            assert np.array_equal(rows, dense)
    assert np.array_equal(read_npy(raw.labels), labels)
    assert head.has_split and head.source["split"] == {"origin": "stratified", "ratios": [0.6, 0.2, 0.2],
                                                       "seed": 0}
    split = [read_npy(raw.split(name)) for name in ("train", "val", "test")]
    assert sum(len(s) for s in split) == len(np.unique(np.concatenate(split))) == 34493
    for cls, size in enumerate(np.bincount(labels)):
        for part, ratio in zip(split, (0.6, 0.2, 0.2)):
            assert abs(int((labels[part] == cls).sum()) - ratio * size) <= 1


@pytest.mark.parametrize("name, nodes, edges, dim, classes, split", [
    ("cora-planetoid", 2708, 10556, 1433, 7, (140, 500, 1000)),
    ("citeseer-planetoid", 3327, 9104, 3703, 6, (120, 500, 1000)),
])
def test_planetoid_keeps_published_split(tmp_path: Path, name: str, nodes: int, edges: int, dim: int,
                                         classes: int, split: tuple[int, int, int]) -> None:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data not present (a user's clone)")
    path = SHARED_DATA / f"{name}.npz"
    raw = import_dataset(path, tmp_path / name, fmt="npz", progress=False)
    head = raw.header
    assert (head.num_nodes, head.num_edges, head.feat_dim, head.num_classes) == (nodes, edges, dim, classes)
    assert head.source["split"] == {"origin": "input"}
    with np.load(path) as npz:
        for name_, key in zip(("train", "val", "test"), ("idx_train", "idx_val", "idx_test")):
            assert np.array_equal(read_npy(raw.split(name_)), npz[key])
    assert tuple(len(read_npy(raw.split(n))) for n in ("train", "val", "test")) == split
    # symmetric input stays the same edge set when symmetrized and deduplicated
    sym = import_dataset(path, tmp_path / "sym", fmt="npz", options=ImportOptions(undirected=True, dedup=True),
                         memory_budget=1 << 16, progress=False)
    assert sym.header.num_edges == edges


# ---------------------------------------------------------------- bad input


def small_graph(with_split: bool = True) -> Graph:
    return Graph(np.array([0, 1, 2, 3]), np.array([1, 2, 3, 0]),
                 np.arange(12, dtype=np.float32).reshape(4, 3), np.array([0, 1, 0, 1]),
                 (np.array([0]), np.array([1]), np.array([2, 3])) if with_split else None)


def assert_fails(src: Path, fmt: str, match: str, **kwargs: Any) -> UserError:
    out = src.parent / "out"
    with pytest.raises(UserError, match=match) as info:
        import_dataset(src, out, fmt=fmt, progress=False, **kwargs)
    assert "\n" not in str(info.value)
    assert not out.exists()
    assert not list(src.parent.glob(".out.tmp-*")), "a temporary output directory was left behind"
    return info.value


def numpy_input(tmp_path: Path, graph: Graph | None = None, **kwargs: Any) -> Path:
    write_numpy(tmp_path / "in", graph or small_graph(), **kwargs)
    return tmp_path / "in"


def npz_input(tmp_path: Path, graph: Graph | None = None, **override: Any) -> Path:
    path = tmp_path / "g.npz"
    write_npz(path, graph or small_graph(), rng=np.random.default_rng(0), **override)
    return path


def ogb_input(tmp_path: Path, graph: Graph | None = None) -> Path:
    write_ogb(tmp_path / "ogb", graph or small_graph())
    return tmp_path / "ogb"


def test_unknown_format(tmp_path: Path) -> None:
    assert_fails(numpy_input(tmp_path), "csv", "unknown import format 'csv'")
    assert IMPORT_FORMATS == ("npz", "ogb", "numpy")


def test_existing_output_directory(tmp_path: Path) -> None:
    src = numpy_input(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("mine")
    with pytest.raises(UserError, match="already exists"):
        import_dataset(src, tmp_path / "out", fmt="numpy", progress=False)
    assert (tmp_path / "out" / "keep").read_text() == "mine"


def test_missing_input(tmp_path: Path) -> None:
    assert_fails(tmp_path / "nothing", "numpy", "no such file or directory")


@pytest.mark.parametrize("name", ["features.npy", "edge_index.npy", "labels.npy"])
def test_truncated_npy(tmp_path: Path, name: str) -> None:
    src = numpy_input(tmp_path)
    path = src / name
    path.write_bytes(path.read_bytes()[:-5])
    assert_fails(src, "numpy", f"{name}: truncated")


def test_corrupt_npz_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "g.npz"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    assert_fails(path, "npz", r"g\.npz: not a readable \.npz archive")


def test_npz_that_is_an_npy(tmp_path: Path) -> None:
    path = tmp_path / "g.npz"
    with open(path, "wb") as handle:
        np.save(handle, np.arange(3))
    assert_fails(path, "npz", "not an .npz archive")


@pytest.mark.parametrize("member", ["adj_indices.npy", "attr_data.npy", "labels.npy"])
def test_corrupt_npz_member(tmp_path: Path, member: str) -> None:
    """A flipped byte inside an uncompressed member is caught by the zip CRC."""
    path = tmp_path / "g.npz"
    graph = small_graph()
    np.savez(path, adj_data=np.ones(4, np.float32), adj_indices=graph.dst, adj_indptr=np.arange(5),
             adj_shape=np.array([4, 4]), attr_data=graph.features.ravel(), attr_indices=np.tile(np.arange(3), 4),
             attr_indptr=np.arange(0, 13, 3), attr_shape=np.array([4, 3]), labels=graph.labels)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    blob = bytearray(path.read_bytes())
    # past the local header and the .npy header: the last byte of the array data
    blob[info.header_offset + 30 + len(info.filename) + info.file_size - 1] ^= 0x01
    path.write_bytes(bytes(blob))
    assert_fails(path, "npz", member.removesuffix(".npy"))


@pytest.mark.parametrize("key", ["adj_indptr", "adj_indices", "adj_data", "adj_shape", "labels", "attr_indptr",
                                 "attr_data", "attr_indices", "attr_shape"])
def test_npz_missing_key(tmp_path: Path, key: str) -> None:
    assert_fails(npz_input(tmp_path, **{key: None}), "npz", f"missing key '{key}'")


def test_npz_no_features(tmp_path: Path) -> None:
    override = {k: None for k in ("attr_data", "attr_indices", "attr_indptr", "attr_shape")}
    assert_fails(npz_input(tmp_path, **override), "npz", "no node features")


def test_npz_partial_split(tmp_path: Path) -> None:
    assert_fails(npz_input(tmp_path, idx_test=None), "npz", "has idx_train, idx_val but not idx_test")


def test_wrong_feature_row_count_numpy(tmp_path: Path) -> None:
    src = numpy_input(tmp_path)
    np.save(src / "features.npy", np.ones((5, 3), np.float32))
    assert_fails(src, "numpy", "labels.npy: 4 labels, but features.npy has 5 rows")


def test_wrong_feature_row_count_npz(tmp_path: Path) -> None:
    assert_fails(npz_input(tmp_path, dense=True, attr_matrix=np.ones((3, 3), np.float32)), "npz",
                 r"\[attr_matrix\]: 3 feature rows, but adj_shape says 4 nodes")


@pytest.mark.parametrize("rows", [3, 5])
def test_wrong_feature_row_count_ogb(tmp_path: Path, rows: int) -> None:
    src = ogb_input(tmp_path)
    write_gz_lines(src / "raw" / "node-feat.csv.gz", ["1.0,2.0,3.0"] * rows)
    assert_fails(src, "ogb", "node-feat.csv.gz: (3 feature rows, expected 4|more than 4 feature rows)",
                 memory_budget=200)


@pytest.mark.parametrize("bad", [4, -1])
def test_edge_id_out_of_range_numpy(tmp_path: Path, bad: int) -> None:
    graph = small_graph()
    graph.dst[2] = bad
    assert_fails(numpy_input(tmp_path, graph), "numpy", rf"edge_index.npy: edge 2 \(2 -> {bad}\)")


def test_edge_id_out_of_range_npz(tmp_path: Path) -> None:
    graph = small_graph()
    graph.dst[3] = 7
    assert_fails(npz_input(tmp_path, graph, adj_data=np.ones(4, np.float32)), "npz",
                 r"\[adj_indices\]: entry 3 is column 7, outside \[0, 4\)")


def test_edge_id_out_of_range_ogb(tmp_path: Path) -> None:
    graph = small_graph()
    graph.src[1] = 99
    assert_fails(ogb_input(tmp_path, graph), "ogb", r"edge.csv.gz: edge 1 \(99 -> 2\)")


def test_ogb_unparseable_line(tmp_path: Path) -> None:
    src = ogb_input(tmp_path)
    write_gz_lines(src / "raw" / "edge.csv.gz", ["0,1", "1,x"])
    assert_fails(src, "ogb", "edge.csv.gz: lines 1-2: could not convert string 'x'")


def test_ogb_corrupt_gzip(tmp_path: Path) -> None:
    src = ogb_input(tmp_path)
    path = src / "raw" / "node-feat.csv.gz"
    path.write_bytes(path.read_bytes()[:-12])
    assert_fails(src, "ogb", "node-feat.csv.gz: cannot read")


def test_ogb_several_splits(tmp_path: Path) -> None:
    src = ogb_input(tmp_path)
    (src / "split" / "random").mkdir()
    assert_fails(src, "ogb", "several splits")
    raw = import_dataset(src, tmp_path / "forced", fmt="ogb", options=ImportOptions(force_split=True),
                         progress=False)
    assert raw.header.source["split"]["origin"] == "stratified"


def test_ogb_node_count_mismatch(tmp_path: Path) -> None:
    src = ogb_input(tmp_path)
    write_gz_lines(src / "raw" / "num-node-list.csv.gz", ["5"])
    assert_fails(src, "ogb", "4 labels, but num-node-list.csv.gz says 5 nodes")


def test_ogb_not_a_dataset_root(tmp_path: Path) -> None:
    src = ogb_input(tmp_path)
    assert_fails(src / "raw", "ogb", "no raw/ directory")


@pytest.mark.parametrize("fmt", IMPORT_FORMATS)
def test_nan_feature(tmp_path: Path, fmt: str) -> None:
    graph = small_graph()
    graph.features[2, 1] = np.nan
    src = {"npz": npz_input, "ogb": ogb_input, "numpy": numpy_input}[fmt](tmp_path, graph)
    # a small budget puts the bad row in a later chunk, after edges and earlier rows are written
    assert_fails(src, fmt, "feature row 2 has NaN or infinite values", memory_budget=64)


def test_float16_overflow(tmp_path: Path) -> None:
    graph = small_graph()
    graph.features[1, 0] = 1e6
    assert_fails(numpy_input(tmp_path, graph), "numpy", "feature row 1 has values too large for float16",
                 options=ImportOptions(feat_dtype="float16"))


@pytest.mark.parametrize("fmt", IMPORT_FORMATS)
def test_overlapping_splits(tmp_path: Path, fmt: str) -> None:
    graph = small_graph()
    graph.split = (np.array([0, 1]), np.array([2]), np.array([3, 1]))
    src = {"npz": npz_input, "ogb": ogb_input, "numpy": numpy_input}[fmt](tmp_path, graph)
    assert_fails(src, fmt, "node 1 is also in the train split")


def test_split_out_of_range(tmp_path: Path) -> None:
    graph = small_graph()
    graph.split = (np.array([0, 9]), np.array([2]), np.array([3]))
    assert_fails(numpy_input(tmp_path, graph), "numpy", r"train_idx.npy: node id 9 \(entry 1\) is outside")


def test_split_unlabeled_node(tmp_path: Path) -> None:
    graph = small_graph()
    graph.labels[2] = -1
    assert_fails(numpy_input(tmp_path, graph), "numpy", "node 2 is in the test split but has no label")


def test_numpy_partial_split(tmp_path: Path) -> None:
    src = numpy_input(tmp_path)
    (src / "val_idx.npy").unlink()
    assert_fails(src, "numpy", "no split file for val")


def test_numpy_idx_and_mask(tmp_path: Path) -> None:
    src = numpy_input(tmp_path)
    np.save(src / "train_mask.npy", np.ones(4, dtype=bool))
    assert_fails(src, "numpy", "both train_idx.npy and train_mask.npy")


def test_numpy_transposed_edge_index(tmp_path: Path) -> None:
    src = numpy_input(tmp_path)
    np.save(src / "edge_index.npy", np.array([[0, 1], [1, 2], [2, 3]]))
    assert_fails(src, "numpy", r"shape \(3, 2\), expected \(2, E\); save edge_index.T")


@pytest.mark.parametrize("labels, match", [
    (np.array([0, 1, -2, 0]), "label -2 of node 2 is negative"),
    (np.array([0.0, 1.5, 0.0, 1.0]), "label 1.5 of node 1 is not an integer"),
    (np.array([[1, 0], [1, 1], [0, 1], [0, 0]]), "node 1 has 2 labels; multi-label"),
    (np.array(["a", "b", "c", "d"]), "expected integers"),
])
def test_bad_labels(tmp_path: Path, labels: np.ndarray, match: str) -> None:
    src = numpy_input(tmp_path, small_graph(with_split=False))
    np.save(src / "labels.npy", labels)
    assert_fails(src, "numpy", match)


@pytest.mark.parametrize("make", [
    lambda: ImportOptions(feat_dtype="float64"),
    lambda: ImportOptions(split=(0.7, 0.2, 0.2)),
    lambda: ImportOptions(split=(0.5, -0.1, 0.2)),
    lambda: ImportOptions(split_seed=-1),
])
def test_bad_options(make: Callable[[], ImportOptions]) -> None:
    with pytest.raises(UserError):
        make()


def test_bad_memory_budget(tmp_path: Path) -> None:
    assert_fails(numpy_input(tmp_path), "numpy", "memory budget", memory_budget=0)


def test_disk_full_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self: RawDatasetWriter, rows: np.ndarray) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RawDatasetWriter, "append_features", full)
    assert_fails(numpy_input(tmp_path), "numpy", "no space left on device while writing")


@pytest.mark.parametrize("fmt", IMPORT_FORMATS)
def test_progress_enabled(tmp_path: Path, fmt: str, caplog: pytest.LogCaptureFixture) -> None:
    src = {"npz": npz_input, "ogb": ogb_input, "numpy": numpy_input}[fmt](tmp_path)
    with caplog.at_level("INFO", logger="megabatch"):
        import_dataset(src, tmp_path / "out", fmt=fmt, options=ImportOptions(dedup=True), progress=True)
    assert "import features: done" in caplog.text


def test_provenance(tmp_path: Path) -> None:
    src = numpy_input(tmp_path, small_graph(with_split=False))
    options = ImportOptions(split_seed=7, drop_self_loops=True)
    raw = import_dataset(src, tmp_path / "out", fmt="numpy", options=options, progress=False)
    assert raw.header.source == {"importer": "numpy", "input": str(src), "options": options.to_json(),
                                 "split": {"origin": "stratified", "ratios": [0.6, 0.2, 0.2], "seed": 7}}
    assert raw.path == (tmp_path / "out").resolve()
