"""import --task link: the seeded edge split against a plain reference, negatives, determinism, errors, cora."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loader.offline.link_split as link_split
from loader.cli import main
from loader.format.link import RAW_LINK_FILES, parse_edge_split
from loader.format.npyio import read_npy
from loader.format.raw import RawDataset, open_raw, validate_raw
from loader.offline.importers import ImportOptions, import_dataset
from loader.offline.link_split import split_sizes
from proto.errors import UserError
from tests.graphs import link_input_graph as input_graph
from tests.graphs import link_raw, shared_graph

SPLITS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def raw_link_arrays(raw: RawDataset) -> dict[str, np.ndarray]:
    arrays = {name: read_npy(raw.link_file(name)) for name in RAW_LINK_FILES}
    arrays["edge_src"], arrays["edge_dst"] = read_npy(raw.edge_src), read_npy(raw.edge_dst)
    return arrays


def reference_units(src: np.ndarray, dst: np.ndarray, directed: bool) -> set[tuple[int, int]]:
    if directed:
        return {(s, d) for s, d in zip(src.tolist(), dst.tolist()) if s != d}
    return {(min(s, d), max(s, d)) for s, d in zip(src.tolist(), dst.tolist()) if s != d}


def pairs_of(edges: np.ndarray) -> list[tuple[int, int]]:
    return list(zip(edges[0].tolist(), edges[1].tolist()))


@SPLITS
@given(n=st.integers(2, 40), e=st.integers(0, 150), symmetric=st.booleans(), undirected=st.booleans(),
       ratios=st.sampled_from([(0.8, 0.1, 0.1), (0.85, 0.05, 0.10), (0.5, 0.5, 0.0), (0.34, 0.33, 0.33), (1.0, 0, 0)]),
       seed=st.integers(0, 2**31), k=st.integers(1, 6), block=st.sampled_from([1, 3, 1 << 16]))
def test_split_matches_the_reference(tmp_path_factory, monkeypatch, n, e, symmetric, undirected, ratios, seed, k,
                                     block):
    """Pairs kept together, splits disjoint and complete, sizes exact, held-out edges removed, the rest in order."""
    monkeypatch.setattr(link_split, "SPLIT_BLOCK_PAIRS", block)  # several blocks exercise the per-block draws
    src, dst = input_graph(seed, n, e, symmetric)
    tmp = tmp_path_factory.mktemp("split")
    raw = link_raw(tmp / "raw", src, dst, n, undirected=undirected, edge_split=ratios, seed=seed, eval_negatives=k)
    validate_raw(raw, 1 << 20, progress=False)
    link = raw.header.link
    assert link is not None and raw.header.task == "link"
    stored = reference_units(src, dst, directed=True)
    directed = not (undirected or all((d, s) in stored for s, d in stored))
    assert link.directed == directed
    if symmetric or undirected:
        assert not directed
    if undirected:  # the importer symmetrized: the graph is the input with both directions, sorted
        src, dst = np.concatenate((src, dst[src != dst])), np.concatenate((dst, src[src != dst]))
    units = reference_units(src, dst, directed)
    arrays = raw_link_arrays(raw)
    parts = {name: pairs_of(arrays[f"{name}_edges"]) for name in ("train", "val", "test")}
    for name, pairs in parts.items():
        assert len(set(pairs)) == len(pairs) == link.of(name), name
        assert all(s != d for s, d in pairs)
        if not directed:
            assert all(s < d for s, d in pairs)  # one per unordered pair, (lower, higher)
    assert set(parts["train"]) | set(parts["val"]) | set(parts["test"]) == units
    assert (link.train, link.val, link.test) == split_sizes(len(units), ratios)
    assert abs(link.val - ratios[1] * len(units)) <= 0.5 and abs(link.test - ratios[2] * len(units)) <= 1
    held = set(parts["val"]) | set(parts["test"])
    unit_of = (lambda s, d: (s, d)) if directed else (lambda s, d: (min(s, d), max(s, d)))
    expected = [(s, d) for s, d in zip(src.tolist(), dst.tolist()) if s == d or unit_of(s, d) not in held]
    graph = list(zip(arrays["edge_src"].tolist(), arrays["edge_dst"].tolist()))
    assert (sorted(graph) if undirected else graph) == (sorted(expected) if undirected else expected)
    assert raw.header.num_edges == len(expected)
    for name in ("val", "test"):
        tails = arrays[f"{name}_neg_tails"]
        assert tails.shape == (link.of(name), k) and tails.dtype == np.int64
        assert tails.size == 0 or (tails.min() >= 0 and tails.max() < n)


def test_split_sizes_round_to_nearest_and_never_exceed():
    assert split_sizes(100, (0.85, 0.05, 0.10)) == (85, 5, 10)
    assert split_sizes(7, (0.5, 0.5, 0.0)) == (3, 4, 0)
    assert split_sizes(0, (0.8, 0.1, 0.1)) == (0, 0, 0)
    assert split_sizes(3, (0.0 + 1 / 3, 1 / 3, 1 / 3)) == (1, 1, 1)


def test_same_seed_same_files_other_seed_other_split_any_budget(tmp_path):
    src, dst = input_graph(5, 300, 1500, symmetric=True)
    a = link_raw(tmp_path / "a", src, dst, 300, seed=7)
    b = link_raw(tmp_path / "b", src, dst, 300, seed=7, memory_budget=1 << 16)  # tiny: many sort buckets
    c = link_raw(tmp_path / "c", src, dst, 300, seed=8)
    for name in [*RAW_LINK_FILES.values(), "edge_src.npy", "edge_dst.npy"]:
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes(), name
    assert a.header.link == b.header.link
    assert set(pairs_of(read_npy(a.link_file("val_edges")))) != set(pairs_of(read_npy(c.link_file("val_edges"))))
    assert not np.array_equal(read_npy(a.link_file("val_neg_tails")), read_npy(c.link_file("val_neg_tails")))


def test_negatives_are_the_documented_stream(tmp_path):
    """K tails per positive from default_rng([seed, 1]) (val) and [seed, 2] (test), in blocks of whole rows."""
    src, dst = input_graph(6, 200, 2000, symmetric=False)
    raw = link_raw(tmp_path / "raw", src, dst, 200, seed=3, eval_negatives=7, edge_split=(0.6, 0.2, 0.2))
    for name, stream in (("val", 1), ("test", 2)):
        count = raw.header.link.of(name)
        expected = np.random.default_rng([3, stream]).integers(0, 200, size=(count, 7), dtype=np.int64)
        np.testing.assert_array_equal(read_npy(raw.link_file(f"{name}_neg_tails")), expected)


def test_a_node_import_is_unchanged_by_the_link_options(tmp_path):
    """task=node writes no link file and no task key; its provenance has no link option."""
    src, dst = input_graph(1, 50, 100, symmetric=False)
    link_raw(tmp_path / "link", src, dst, 50)
    source = tmp_path / "link-input"
    raw = import_dataset(source, tmp_path / "node", fmt="numpy", options=ImportOptions(), progress=False)
    header = json.loads((raw.path / "raw.json").read_text())
    assert "task" not in header and "link" not in header and "edge_split" not in header["source"]["options"]
    assert not any((raw.path / name).exists() for name in RAW_LINK_FILES.values())
    assert raw.header.task == "node" and raw.header.link is None


@pytest.mark.parametrize("text, words", [
    ("a,b,c", "cannot parse"), ("0.5,0.5", "has 2 values"), ("0.9,0.2,0.1", "sum to 1.2, not 1"),
    ("-0.1,0.6,0.5", "ratios in [0, 1]"), ("0,0.5,0.5", "train ratio must be above 0"), ("nan,0,0", "ratios in [0, 1]"),
])
def test_bad_edge_split_is_a_one_line_error(text, words):
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("]", r"\]")) as err:
        parse_edge_split(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args, words", [
    (["--task", "link", "--edge-split", "0.7,0.2,0.2"], "--edge-split"),
    (["--task", "link", "--eval-negatives", "0"], "--eval-negatives"),
    (["--task", "link", "--edge-split-seed", "-1"], "--edge-split-seed"),
    (["--edge-split", "0.8,0.1,0.1"], "only with --task link"),
])
def test_cli_refuses_bad_link_options_in_one_line(tmp_path, capsys, args, words):
    src, dst = input_graph(2, 20, 40, symmetric=False)
    link_raw(tmp_path / "ok", src, dst, 20)
    capsys.readouterr()  # the setup's own log lines (at whatever level an earlier test left logging): not main's
    code = main(["--no-progress", "-q", "import", str(tmp_path / "ok-input"), str(tmp_path / "out"),
                 "--format", "numpy", *args])
    err = capsys.readouterr().err.strip()
    assert code == 1 and words in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_cora_link_import(tmp_path):
    """The shared cora npz stores both directions: split by unordered pair, both directions removed together."""
    path = shared_graph("cora-planetoid.npz")
    assert main(["--no-progress", "-q", "import", str(path), str(tmp_path / "raw"), "--format", "npz", "--task", "link",
                 "--edge-split", "0.85,0.05,0.10", "--edge-split-seed", "4", "--eval-negatives", "20"]) == 0
    raw = open_raw(tmp_path / "raw")
    link = raw.header.link
    assert link is not None and not link.directed and link.eval_negatives == 20 and link.seed == 4
    pairs = 10556 // 2
    assert (link.train, link.val, link.test) == split_sizes(pairs, (0.85, 0.05, 0.10)) == (4486, 264, 528)
    assert raw.header.num_edges == 2 * link.train
    graph = set(zip(read_npy(raw.edge_src).tolist(), read_npy(raw.edge_dst).tolist()))
    for name in ("val", "test"):
        for s, d in pairs_of(read_npy(raw.link_file(f"{name}_edges"))):
            assert (s, d) not in graph and (d, s) not in graph
    train = pairs_of(read_npy(raw.link_file("train_edges")))
    assert all((s, d) in graph and (d, s) in graph for s, d in train)
    assert raw.header.has_split  # the node split (Planetoid's) is kept beside the edge split
