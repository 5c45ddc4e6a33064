"""``megabatch import --format ogb --task link`` of an OGB link-property directory: its own split (torch ``.pt``
files, read without torch), its per-positive negatives where it has them (ogbl-citation2) and drawn tails where
it has one shared set (ogbl-collab), the held-out pairs kept out of the graph; then prepare and train."""

import logging

import numpy as np
import pytest
import torch

from loader.format.raw import open_raw
from loader.offline.importers import ImportOptions, import_dataset
from loader.offline.prepare import PrepareOptions, prepare_dataset
from proto.errors import UserError
from tests.loader.offline.importers.test_importers import write_gz_lines

N, DIM = 60, 5


def ogbl(root, *, style="citation2", edge_in_graph=False):
    """A small ogbl-* directory: a random training graph, its edges as ``train.pt``, 8 + 8 held-out positives."""
    rng = np.random.default_rng(3)
    pairs = rng.choice(N * N, 200, replace=False)
    src, dst = pairs // N, pairs % N
    keep = src != dst
    src, dst = src[keep], dst[keep]
    train, val, test = slice(0, len(src) - 16), slice(len(src) - 16, len(src) - 8), slice(len(src) - 8, None)
    graph_end = len(src) if edge_in_graph else len(src) - 16
    write_gz_lines(root / "raw" / "edge.csv.gz", [f"{s},{t}" for s, t in zip(src[:graph_end], dst[:graph_end])])
    write_gz_lines(root / "raw" / "node-feat.csv.gz",
                   [",".join(repr(float(x)) for x in row) for row in rng.standard_normal((N, DIM)).tolist()])
    write_gz_lines(root / "raw" / "num-node-list.csv.gz", [str(N)])
    folder = root / "split" / "time"
    folder.mkdir(parents=True)
    tails = {}
    for name, part in (("train", train), ("valid", val), ("test", test)):
        s, d = torch.from_numpy(src[part]), torch.from_numpy(dst[part])
        if style == "citation2":
            data = {"source_node": s, "target_node": d}
            if name != "train":
                tails[name] = torch.from_numpy(rng.integers(0, N, (len(s), 4)))
                data["target_node_neg"] = tails[name]
        else:
            data = {"edge": torch.stack((s, d), dim=1)}
            if name != "train":
                data["edge_neg"] = torch.from_numpy(rng.integers(0, N, (20, 2)))
        torch.save(data, folder / f"{name}.pt")
    return root, (src, dst, train, val, test), tails


@pytest.mark.parametrize("edge_in_graph", [False, True])
def test_citation2_style_split_and_tails_are_kept(tmp_path, edge_in_graph):
    src_dir, (src, dst, train, val, test), tails = ogbl(tmp_path / "ogbl", edge_in_graph=edge_in_graph)
    raw = import_dataset(src_dir, tmp_path / "raw", fmt="ogb", options=ImportOptions(task="link"), progress=False)
    link = raw.header.link
    assert (link.train, link.val, link.test, link.eval_negatives, link.directed) == (len(src) - 16, 8, 8, 4, True)
    for name, part in (("train", train), ("val", val), ("test", test)):
        np.testing.assert_array_equal(np.load(raw.path / f"{name}_edges.npy"), np.stack((src[part], dst[part])))
    np.testing.assert_array_equal(np.load(raw.path / "val_neg_tails.npy"), tails["valid"].numpy())
    np.testing.assert_array_equal(np.load(raw.path / "test_neg_tails.npy"), tails["test"].numpy())
    # the graph is the training edges: held-out pairs found in raw/edge.csv.gz are removed
    graph = set(zip(np.load(raw.path / "edge_src.npy").tolist(), np.load(raw.path / "edge_dst.npy").tolist()))
    assert graph == set(zip(src[train].tolist(), dst[train].tolist()))
    assert open_raw(raw.path).header.source["ogb_link_split"].endswith("split/time")
    prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=2, progress=False))


def test_shared_negatives_are_replaced_by_drawn_tails(tmp_path, caplog):
    src_dir, (src, dst, train, val, test), _ = ogbl(tmp_path / "ogbl", style="collab")
    with caplog.at_level(logging.WARNING, logger="megabatch"):
        raw = import_dataset(src_dir, tmp_path / "raw", fmt="ogb", options=ImportOptions(
            task="link", undirected=True, eval_negatives=6), progress=False)
    assert "one set of pairs for every positive" in caplog.text
    assert raw.header.link.directed is False and raw.header.link.eval_negatives == 6
    assert np.load(raw.path / "val_neg_tails.npy").shape == (8, 6)


def test_a_knowledge_graph_split_is_refused(tmp_path):
    src_dir, _, _ = ogbl(tmp_path / "ogbl")
    torch.save({"head": torch.arange(3), "relation": torch.arange(3), "tail": torch.arange(3)},
               src_dir / "split" / "time" / "train.pt")
    with pytest.raises(UserError, match="a knowledge graph's split"):
        import_dataset(src_dir, tmp_path / "raw", fmt="ogb", options=ImportOptions(task="link"), progress=False)
    assert not (tmp_path / "raw").exists()
