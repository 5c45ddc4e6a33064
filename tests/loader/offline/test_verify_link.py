"""verify on a link dataset: a fresh one passes; a corrupted link file is caught, by its checksum or, re-signed,
by the structure checks."""

import json
import shutil

import numpy as np
import pytest

from loader.format.dataset import LINK_FILES, manifest_text, open_dataset
from loader.format.fileio import file_xxh3
from loader.format.link import read_edge_buckets, read_link_tables
from loader.format.npyio import read_npy, write_npy
from loader.offline.prepare import PrepareOptions, prepare_dataset
from loader.offline.verify import verify_dataset
from proto.errors import UserError
from tests.graphs import link_input_graph, link_raw


@pytest.fixture(scope="module")
def link_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify-link")
    src, dst = link_input_graph(12, 300, 2000, symmetric=True)
    raw = link_raw(tmp / "raw", src, dst, 300, edge_split=(0.8, 0.1, 0.1))
    prepare_dataset(raw.path, tmp / "ds", PrepareOptions(num_partitions=4, progress=False))
    return tmp / "ds"


def rewrite(ds, name: str, array: np.ndarray) -> None:
    """Replace a data file and re-sign the manifest, so only the structure checks can object."""
    (ds / name).unlink()
    write_npy(ds / name, array)
    data = json.loads((ds / "manifest.json").read_text())
    data.pop("checksum")
    data["files"][name] = {"bytes": (ds / name).stat().st_size, "xxh3_64": file_xxh3(ds / name)}
    (ds / "manifest.json").write_text(manifest_text(data))


def problems_after(link_dir, tmp_path, change) -> list[str]:
    copy = tmp_path / "ds"
    shutil.copytree(link_dir, copy)
    change(copy)
    report = verify_dataset(copy, progress=False)
    assert not report.ok
    return report.problems


def test_fresh_link_dataset_passes(link_dir):
    report = verify_dataset(link_dir, progress=False)
    assert report.ok and report.checks[-1] == "link", report.problems


@pytest.mark.parametrize("name", sorted(LINK_FILES.values()))
def test_a_flipped_byte_in_a_link_file_is_caught(link_dir, tmp_path, name):
    def flip(ds):
        data = bytearray((ds / name).read_bytes())
        data[len(data) // 2] ^= 0x10
        (ds / name).write_bytes(bytes(data))

    assert any(name in p for p in problems_after(link_dir, tmp_path, flip))


def test_a_link_file_missing_from_the_manifest_is_named(link_dir, tmp_path):
    def drop(ds):
        data = json.loads((ds / "manifest.json").read_text())
        data.pop("checksum")
        del data["files"]["edge_buckets.npy"]
        (ds / "manifest.json").write_text(manifest_text(data))

    assert any("no checksum recorded for edge_buckets.npy" in p for p in problems_after(link_dir, tmp_path, drop))


def train_and_offsets(ds):
    return read_npy(ds / "train_edges.npy"), read_npy(ds / "edge_buckets.npy")


def test_train_edges_out_of_bucket_order(link_dir, tmp_path):
    def swap(ds):
        train, offsets = train_and_offsets(ds)
        first, last = 0, train.shape[1] - 1  # the first and last buckets differ (4 partitions, 2000 edges)
        train[:, [first, last]] = train[:, [last, first]]
        rewrite(ds, "train_edges.npy", train)

    assert any("not in edge-bucket order" in p for p in problems_after(link_dir, tmp_path, swap))


def test_bucket_offsets_that_disagree_with_partitions(link_dir, tmp_path):
    def shift(ds):
        _train, offsets = train_and_offsets(ds)
        k = int(np.flatnonzero(np.diff(offsets[:-1]) > 0)[-1]) + 1  # a boundary after a non-empty bucket
        offsets[k] -= 1
        rewrite(ds, "edge_buckets.npy", offsets)

    assert any("edge_buckets.npy: bucket" in p for p in problems_after(link_dir, tmp_path, shift))


def test_a_held_out_edge_left_in_the_graph(link_dir, tmp_path):
    def leak(ds):
        train, _offsets = train_and_offsets(ds)
        val = read_npy(ds / "val_edges.npy")
        val[:, 0] = train[:, 0]
        rewrite(ds, "val_edges.npy", val)

    assert any("val_edges.npy: held-out positive 0" in p and "is an edge of the graph" in p
               for p in problems_after(link_dir, tmp_path, leak))


def test_a_pair_in_both_held_out_splits(link_dir, tmp_path):
    def repeat(ds):
        test = read_npy(ds / "test_edges.npy")
        test[:, 0] = read_npy(ds / "val_edges.npy")[:, 0]
        rewrite(ds, "test_edges.npy", test)

    assert any("hold a pair twice" in p for p in problems_after(link_dir, tmp_path, repeat))


def test_a_negative_out_of_range(link_dir, tmp_path):
    def bad(ds):
        tails = read_npy(ds / "test_neg_tails.npy")
        tails[3, 1] = 300
        rewrite(ds, "test_neg_tails.npy", tails)

    problems = problems_after(link_dir, tmp_path, bad)
    assert any("test_neg_tails.npy holds node ids outside [0, 300)" in p for p in problems)


def test_a_pair_of_the_graph_missing_from_the_training_positives(link_dir, tmp_path):
    def drop_last(ds):
        train, offsets = train_and_offsets(ds)
        offsets[offsets == train.shape[1]] -= 1
        data = json.loads((ds / "manifest.json").read_text())
        data.pop("checksum")
        data["link"]["train"] -= 1
        (ds / "manifest.json").write_text(manifest_text(data))
        rewrite(ds, "edge_buckets.npy", offsets)
        rewrite(ds, "train_edges.npy", train[:, :-1])

    assert any("every pair of the graph is a training positive, once" in p
               for p in problems_after(link_dir, tmp_path, drop_last))


def tables_of(ds):
    """The pair tables and the edge buckets, each through its checked reader."""
    dataset = open_dataset(ds)
    m = dataset.manifest
    return read_link_tables(dataset, m.link, m.num_nodes), read_edge_buckets(dataset, m.link, m.num_partitions)


def test_the_link_readers_table_check_names_the_file(link_dir, tmp_path):
    # the daemon and the in-memory trainer read the tables through read_link_tables: one check for both
    tables, buckets = tables_of(link_dir)
    assert tables.train_edges.shape[1] == buckets[-1]
    assert set(tables.held_edges) == set(tables.held_tails) == {"val", "test"}
    for name, change, message in [
            ("val_edges.npy", lambda a: a[:, :-1], r"val_edges.npy: shape \(2, \d+\), the manifest's link table says"),
            ("test_neg_tails.npy", lambda a: np.where(a == a.max(), 300, a), r"test_neg_tails.npy: node ids outside"),
            ("edge_buckets.npy", lambda a: a[:-1], r"edge_buckets.npy: shape \(16,\), expected \(17,\) offsets")]:
        copy = tmp_path / name
        shutil.copytree(link_dir, copy)
        rewrite(copy, name, change(read_npy(copy / name)))
        with pytest.raises(UserError, match=message):
            tables_of(copy)
