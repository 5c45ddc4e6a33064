"""prepare of a link dataset: the split in new ids, edge buckets, the node files untouched; inspect prints the split."""

import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.format.dataset import CHECK_FILES, FILES, FORMAT_VERSION, LINK_FILES, LINK_FORMAT_VERSION
from loader.format.link import RAW_LINK_FILES
from loader.format.npyio import read_npy
from loader.offline.inspect_dataset import dataset_summary, format_summary
from loader.offline.prepare import PrepareOptions, prepare_dataset
from loader.offline.verify import verify_dataset
from proto.errors import UserError
from tests.graphs import link_input_graph as input_graph
from tests.graphs import link_raw, shared_graph


def pairs(edges: np.ndarray) -> list[tuple[int, int]]:
    return list(zip(edges[0].tolist(), edges[1].tolist()))


def assert_link_round_trip(raw_path, ds) -> None:
    """Every prepared link row is its raw row through new_to_orig; train positives in bucket order."""
    m = ds.manifest
    new_to_orig = read_npy(ds.file("new_to_orig"))
    for name in ("val_edges", "test_edges", "val_neg_tails", "test_neg_tails"):
        np.testing.assert_array_equal(new_to_orig[read_npy(ds.file(name))], read_npy(raw_path / RAW_LINK_FILES[name]))
    train = read_npy(ds.file("train_edges"))
    raw_train = read_npy(raw_path / RAW_LINK_FILES["train_edges"])
    assert sorted(pairs(new_to_orig[train])) == sorted(pairs(raw_train))
    parts = ds.partitions()
    p = m.num_partitions
    offsets = read_npy(ds.file("edge_buckets"))
    assert offsets.shape == (p * p + 1,) and offsets[0] == 0 and offsets[-1] == train.shape[1] == m.link.train
    part = np.searchsorted(parts.node_end, train, side="right")
    for bucket in range(p * p):
        lo, hi = int(offsets[bucket]), int(offsets[bucket + 1])
        assert (part[0, lo:hi] == bucket // p).all() and (part[1, lo:hi] == bucket % p).all()
        inside = pairs(train[:, lo:hi])
        assert inside == sorted(inside)  # within a bucket by (source, target)
    assert (np.diff(offsets) >= 0).all()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(6, 120), e=st.integers(0, 500), symmetric=st.booleans(), parts=st.integers(1, 6),
       partitioner=st.sampled_from(["metis", "random"]), seed=st.integers(0, 2**31))
def test_prepare_round_trip(tmp_path_factory, n, e, symmetric, parts, partitioner, seed):
    tmp = tmp_path_factory.mktemp("link")
    src, dst = input_graph(seed, n, e, symmetric)
    raw = link_raw(tmp / "raw", src, dst, n, seed=seed % 1000, edge_split=(0.7, 0.1, 0.2))
    ds = prepare_dataset(raw.path, tmp / "ds", PrepareOptions(num_partitions=parts, partitioner=partitioner,
                                                              memory_budget=256 << 20, progress=False))
    assert ds.manifest.version == LINK_FORMAT_VERSION and ds.manifest.task == "link"
    assert ds.manifest.link == raw.header.link
    assert set(LINK_FILES.values()) <= set(ds.manifest.files)
    assert_link_round_trip(raw.path, ds)
    report = verify_dataset(ds.path, progress=False)
    assert report.ok and "link" in report.checks, report.problems


def test_small_sort_buckets_give_the_same_dataset(tmp_path, monkeypatch):
    """The train positives' external sort in many buckets writes the same files as in one."""
    import loader.offline.extsort as extsort

    src, dst = input_graph(3, 400, 3000, symmetric=True)
    raw = link_raw(tmp_path / "raw", src, dst, 400)
    one = prepare_dataset(raw.path, tmp_path / "one", PrepareOptions(num_partitions=5, progress=False))
    monkeypatch.setattr(extsort, "SORT_BYTES_PER_EDGE", 1 << 24)  # ~64 edges per sort bucket
    many = prepare_dataset(raw.path, tmp_path / "many", PrepareOptions(num_partitions=5, progress=False))
    for name in LINK_FILES.values():
        assert (one.path / name).read_bytes() == (many.path / name).read_bytes(), name
    assert_link_round_trip(raw.path, many)


def test_node_files_and_node_datasets_are_unchanged(tmp_path):
    """The link step only adds: the link dataset's node files are those of the same graph prepared for node
    classification, whose manifest is 1.2 with no link key and no link file."""
    src, dst = input_graph(4, 300, 2000, symmetric=True)
    raw = link_raw(tmp_path / "raw", src, dst, 300)
    node_raw = tmp_path / "node-raw"
    shutil.copytree(raw.path, node_raw)
    header = json.loads((node_raw / "raw.json").read_text())
    del header["task"], header["link"]
    (node_raw / "raw.json").write_text(json.dumps(header))
    for name in RAW_LINK_FILES.values():
        (node_raw / name).unlink()
    options = PrepareOptions(num_partitions=4, progress=False)
    link_ds = prepare_dataset(raw.path, tmp_path / "link", options)
    node_ds = prepare_dataset(node_raw, tmp_path / "node", options)
    node_manifest = json.loads((node_ds.path / "manifest.json").read_text())
    assert node_manifest["version"] == FORMAT_VERSION == "1.2"
    assert "task" not in node_manifest and "link" not in node_manifest
    assert set(node_manifest["files"]) == {*FILES.values(), *CHECK_FILES.values()}
    assert sorted(p.name for p in node_ds.path.iterdir()) == sorted([*node_manifest["files"], "manifest.json"])
    for name in node_manifest["files"]:
        assert (link_ds.path / name).read_bytes() == (node_ds.path / name).read_bytes(), name
    link_manifest = json.loads((link_ds.path / "manifest.json").read_text())
    for key in ("num_nodes", "num_edges", "edge_cut", "splits", "static_cache", "features"):
        assert link_manifest[key] == node_manifest[key], key


def test_inspect_prints_the_split(tmp_path):
    src, dst = input_graph(8, 100, 600, symmetric=False)
    raw = link_raw(tmp_path / "raw", src, dst, 100, seed=2, eval_negatives=9)
    ds = prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=3, progress=False))
    summary = dataset_summary(ds.path)
    assert summary["task"] == "link" and summary["link"] == raw.header.link.to_json()
    text = format_summary(summary)
    link = raw.header.link
    assert (f"link split   directed pairs: train {link.train:,}, val {link.val:,}, test {link.test:,} "
            f"(ratios 0.8/0.1/0.1, seed 2); 9 negative tails per held-out pair") in text


def test_too_many_partitions_for_a_link_dataset(tmp_path, monkeypatch):
    import loader.offline.prepare as prepare

    src, dst = input_graph(8, 60, 100, symmetric=False)
    raw = link_raw(tmp_path / "raw", src, dst, 60)
    monkeypatch.setattr(prepare, "MAX_LINK_PARTITIONS", 2)
    with pytest.raises(UserError, match="a link dataset has at most 2"):
        prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=3, progress=False))
    ds = prepare_dataset(raw.path, tmp_path / "auto", PrepareOptions(progress=False))  # auto (3 here): clamped
    assert ds.manifest.num_partitions == 2


def test_cora_link_dataset(tmp_path):
    from loader.offline.importers import ImportOptions, import_dataset

    raw = import_dataset(shared_graph("cora-planetoid.npz"), tmp_path / "raw", fmt="npz",
                         options=ImportOptions(task="link", eval_negatives=10), progress=False)
    ds = prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=16, progress=False))
    assert ds.manifest.num_edges == 2 * ds.manifest.link.train
    assert_link_round_trip(raw.path, ds)
    report = verify_dataset(ds.path, progress=False)
    assert report.ok, report.problems
