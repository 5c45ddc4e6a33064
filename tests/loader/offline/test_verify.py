"""verify: passes a fresh dataset, and catches a flipped byte anywhere and broken structure."""

import json
import shutil

import numpy as np
import pytest

from loader.format.dataset import FILES, manifest_text
from loader.format.fileio import file_xxh3
from loader.format.npyio import read_npy
from loader.offline.prepare import PrepareOptions, prepare_dataset
from loader.offline.verify import verify_dataset
from tests.graphs import random_graph, write_raw


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    rng = np.random.default_rng(11)
    write_raw(tmp / "raw", *random_graph(rng, 400, 3000, 8), 3)
    prepare_dataset(tmp / "raw", tmp / "ds", PrepareOptions(num_partitions=5, static_ratio=0.05, progress=False))
    return tmp / "ds"


def test_fresh_dataset_passes(dataset_dir):
    report = verify_dataset(dataset_dir, progress=False)
    assert report.ok, report.problems
    assert "static cache" in report.checks


@pytest.mark.parametrize("name", sorted([*FILES.values(), "manifest.json"]))
def test_flipped_byte_in_any_file_is_detected(dataset_dir, tmp_path, name):
    copy = tmp_path / "ds"
    shutil.copytree(dataset_dir, copy)
    data = bytearray((copy / name).read_bytes())
    rng = np.random.default_rng(len(name))
    for position in (0, len(data) // 2, len(data) - 1, int(rng.integers(len(data)))):
        damaged = bytearray(data)
        damaged[position] ^= 1 << int(rng.integers(8))
        (copy / name).write_bytes(bytes(damaged))
        try:
            report = verify_dataset(copy, progress=False)
            assert not report.ok, f"flip at byte {position} of {name} went unnoticed"
        except Exception as err:  # an unreadable manifest is refused at open: also a detection
            assert type(err).__name__ == "UserError"



@pytest.mark.parametrize("name", ["features.bin", "indices.npy"])
def test_a_flipped_byte_is_located_by_its_block(dataset_dir, tmp_path, name):
    """Files with block checksums (format 1.1+): verify names the first damaged block's bytes, not only the file."""
    copy = tmp_path / "ds"
    shutil.copytree(dataset_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    block = manifest["features"]["check_block"] if name == "features.bin" else 4096
    data = bytearray((copy / name).read_bytes())
    at = len(data) // 2 + 3
    data[at] ^= 0x20
    data[-1] ^= 0x01  # a second damaged block, later: the first one is named
    (copy / name).write_bytes(bytes(data))
    report = verify_dataset(copy, progress=False)
    first = at // block * block
    assert report.problems == [f"checksums: {name} content does not match its xxh3_64: the first damaged block is "
                               f"bytes {first} to {first + block - 1} (2 blocks of {block} bytes differ from "
                               f"{'feature_blocks.npy' if name == 'features.bin' else 'index_pages.npy'})"]


def test_no_block_is_named_from_a_damaged_block_table(dataset_dir, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(dataset_dir, copy)
    for name in ("features.bin", "feature_blocks.npy"):
        data = bytearray((copy / name).read_bytes())
        data[-1] ^= 0x01
        (copy / name).write_bytes(bytes(data))
    problems = verify_dataset(copy, progress=False).problems
    assert "checksums: features.bin content does not match its xxh3_64 (its block checksums, feature_blocks.npy, " \
           "are damaged too: no block named)" in problems, problems

def _rewrite_manifest(path, mutate):
    data = json.loads((path / "manifest.json").read_text())
    mutate(data)
    data.pop("checksum")
    (path / "manifest.json").write_text(manifest_text(data))


def _replace_npy(path, name, array):
    """Swap a file's content and re-sign the manifest, so only structural checks can object."""
    np.save(path / name, array)
    _rewrite_manifest(path, lambda d: d["files"].update(
        {name: {"bytes": (path / name).stat().st_size, "xxh3_64": file_xxh3(path / name)}}))


def test_structural_problems_are_reported(dataset_dir, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(dataset_dir, copy)
    train = read_npy(copy / "train_idx.npy")
    val = read_npy(copy / "val_idx.npy")
    _replace_npy(copy, "val_idx.npy", np.sort(np.concatenate([val[1:], train[:1]])))
    indptr = read_npy(copy / "indptr.npy")
    indptr[5], indptr[6] = indptr[6], indptr[5]
    _replace_npy(copy, "indptr.npy", indptr)
    report = verify_dataset(copy, progress=False)
    text = "\n".join(report.problems)
    assert "overlaps another split" in text
    assert "not monotone" in text


def test_permutation_and_alignment_checks(dataset_dir, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(dataset_dir, copy)
    n2o = read_npy(copy / "new_to_orig.npy")
    n2o[0] = n2o[1]
    _replace_npy(copy, "new_to_orig.npy", n2o)
    parts = read_npy(copy / "partitions.npy")
    parts[1, 4] += 8
    _replace_npy(copy, "partitions.npy", parts)
    text = "\n".join(verify_dataset(copy, progress=False).problems)
    assert "new_to_orig.npy is not a permutation" in text
    assert "4096-byte boundary" in text
