import json
import shutil

import numpy as np
import pytest

from loader.format.dataset import manifest_text, open_dataset
from loader.offline.prepare import PrepareOptions, prepare_dataset
from proto.errors import UserError
from tests.graphs import random_graph, write_raw


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds")
    write_raw(tmp / "raw", *random_graph(np.random.default_rng(0), 50, 100, 2), 3)
    prepare_dataset(tmp / "raw", tmp / "ds", PrepareOptions(num_partitions=2, progress=False))
    return tmp / "ds"


def _resign(path, mutate):
    data = json.loads((path / "manifest.json").read_text())
    data.pop("checksum")
    mutate(data)
    (path / "manifest.json").write_text(manifest_text(data))


def test_unknown_major_version_is_refused(dataset_dir, tmp_path):
    shutil.copytree(dataset_dir, tmp_path / "ds")
    _resign(tmp_path / "ds", lambda d: d.update(version="2.0"))
    with pytest.raises(UserError, match="version '2.0' is not supported"):
        open_dataset(tmp_path / "ds")


def test_newer_minor_version_and_unknown_keys_are_kept(dataset_dir, tmp_path):
    shutil.copytree(dataset_dir, tmp_path / "ds")
    _resign(tmp_path / "ds", lambda d: d.update(version="1.7", future_field={"x": 1}))
    manifest = open_dataset(tmp_path / "ds").manifest
    assert manifest.extra == {"future_field": {"x": 1}}
    assert manifest.to_json()["future_field"] == {"x": 1}


def test_missing_field_and_bad_enum_are_named(dataset_dir, tmp_path):
    shutil.copytree(dataset_dir, tmp_path / "ds")
    _resign(tmp_path / "ds", lambda d: d.pop("num_edges"))
    with pytest.raises(UserError, match="missing field 'num_edges'"):
        open_dataset(tmp_path / "ds")
    _resign(tmp_path / "ds", lambda d: d.update(num_edges=100, index_dtype="int8"))
    with pytest.raises(UserError, match="malformed field"):
        open_dataset(tmp_path / "ds")


def test_not_a_dataset(tmp_path):
    with pytest.raises(UserError, match="no manifest.json"):
        open_dataset(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="corrupt JSON"):
        open_dataset(tmp_path)


def test_the_typed_manifest_writes_back_the_json_it_read(dataset_dir):
    """The sub-tables are typed in memory but the format is unchanged: reading and writing back a
    manifest gives the file's exact bytes."""
    text = (dataset_dir / "manifest.json").read_text()
    manifest = open_dataset(dataset_dir).manifest
    assert manifest_text(manifest.to_json()) == text
    assert manifest.edge_cut.edges >= 0 and 0.0 <= manifest.edge_cut.fraction <= 1.0
    assert manifest.splits.train + manifest.splits.val + manifest.splits.test == 50


@pytest.mark.parametrize("table, key", [("edge_cut", "edges"), ("splits", "train"), ("static_cache", "num_nodes"),
                                        ("partitioner", "name")])
def test_a_missing_sub_table_field_is_named(dataset_dir, tmp_path, table, key):
    shutil.copytree(dataset_dir, tmp_path / "ds")
    _resign(tmp_path / "ds", lambda d: d[table].pop(key))
    with pytest.raises(UserError, match=f"missing field '{table}.{key}'"):
        open_dataset(tmp_path / "ds")
