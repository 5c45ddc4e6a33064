"""Spilled superbatches: every batch read back equals the sampled pass's, from RAM and from disk, checked."""

import inspect
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from loader.format.read_checks import CorruptData
from loader.sampling.sampling import SampledBatches, concat_passes, empty_pass, slice_pass
from loader.staging import spilled_pass
from loader.staging.spilled_pass import SpilledPass, SpillFile, concat_spilled, id_dtype, spill_batches
from tests.loader.staging.test_stager import straddling_dataset, window  # noqa: F401  (the module's fixture)


def assert_same_batches(spilled: SpilledPass, sampled) -> None:
    assert spilled.num_batches == sampled.num_batches and spilled.num_hops == sampled.num_hops
    assert np.array_equal(spilled.node_ptr, sampled.node_ptr) and np.array_equal(spilled.nodes, sampled.nodes)
    assert spilled.max_batch_nodes() == sampled.max_batch_nodes()
    assert spilled.max_batch_edges() == sampled.max_batch_edges()
    for b in range(sampled.num_batches):
        mine, theirs = spilled.batch(b), sampled.batch(b)
        assert mine.nodes.dtype == np.int64 and np.array_equal(mine.nodes, theirs.nodes)
        assert mine.edge_index.dtype == np.int64 and np.array_equal(mine.edge_index, theirs.edge_index)
        assert np.array_equal(mine.num_sampled_nodes, theirs.num_sampled_nodes)
        assert np.array_equal(mine.num_sampled_edges, theirs.num_sampled_edges)


@pytest.mark.parametrize("read_ahead", [False, True], ids=["", "read-ahead"])
@pytest.mark.parametrize("on_disk", [False, True], ids=["ram", "disk"])
def test_spilled_batches_read_back_as_sampled(straddling_dataset, tmp_path, monkeypatch, on_disk, read_ahead):  # noqa: F811
    """Read in order (each read asking for the next record ahead, when there is a reader for it) and out of order."""
    monkeypatch.setattr(spilled_pass, "SPILL_GROWTH", 8192)  # the file grows several times
    sampled = window(straddling_dataset, 12)
    ids = id_dtype(straddling_dataset.manifest.num_nodes)
    reader = ThreadPoolExecutor(1) if read_ahead else None
    spill = SpillFile(tmp_path if on_disk else None, reader=reader)
    try:
        # spilled a group at a time, as the staged mode samples
        parts = [spill_batches(slice_pass(sampled, first, min(5, 12 - first)), spill, ids) for first in (0, 5, 10)]
        spilled = concat_spilled(parts, spill, ids)
        assert spilled.nodes.dtype == np.int32 and spilled.ram_bytes < sampled.nodes.nbytes
        assert spill.records == 12 and spill.bytes_written % 4096 == 0
        assert_same_batches(spilled, sampled)
        for b in (7, 3, 4, 11, 0):
            assert np.array_equal(spilled.batch(b).edge_index, sampled.batch(b).edge_index)
        assert spill.bytes_read >= 8 * len(sampled.edge_src)
    finally:
        spill.close()
        if reader is not None:
            reader.shutdown()
    assert not list(tmp_path.iterdir())  # unnamed: nothing left behind


def test_an_empty_piece_joins_a_spilled_superbatch(straddling_dataset, tmp_path):  # noqa: F811
    """A rank's empty piece of a short last step arrives as a plain pass; it is spilled with the rest."""
    sampled = window(straddling_dataset, 3)
    ids = np.dtype(np.int64)
    spill = SpillFile(tmp_path)
    try:
        joined = concat_spilled([spill_batches(sampled, spill, ids), empty_pass(1, sampled.num_hops)], spill, ids)
        assert_same_batches(joined, concat_passes([sampled, empty_pass(1, sampled.num_hops)]))
        with pytest.raises(ValueError, match="different files"):
            other = SpillFile(None)
            try:
                concat_spilled([spill_batches(sampled, other, ids)], spill, ids)
            finally:
                other.close()
    finally:
        spill.close()


def test_a_corrupt_record_fails_its_batch_only(straddling_dataset, tmp_path):  # noqa: F811
    """Read ahead or not, the corrupt record fails its own batch, and the batches around it are served."""
    sampled = window(straddling_dataset, 4)
    reader = ThreadPoolExecutor(1)
    spill = SpillFile(tmp_path, direct=False, reader=reader)
    try:
        spilled = spill_batches(sampled, spill, np.dtype(np.int32))
        base = spill._base[2]
        os.pwrite(spill._fd, b"\xff\xff", base + 8)
        assert np.array_equal(spilled.batch(1).edge_index, sampled.batch(1).edge_index)  # reads record 2 ahead
        with pytest.raises(CorruptData, match="spilled record 2"):
            spilled.batch(2)
        assert np.array_equal(spilled.batch(3).edge_index, sampled.batch(3).edge_index)
        with pytest.raises(CorruptData, match="spilled record 2"):
            spilled.batch(2)  # read again, without a read ahead
        with pytest.raises(IndexError):
            spilled.batch(4)
    finally:
        spill.close()
        reader.shutdown()


@pytest.mark.parametrize("on_disk", [False, True], ids=["ram", "disk"])
def test_node_ids_of_any_range_equal_the_sampled_ids(straddling_dataset, tmp_path, on_disk):  # noqa: F811
    """The planner's slices (any begin:end, across records, empty ones, an empty batch among them) read back the
    ids as sampled, in the spilled dtype."""
    sampled = window(straddling_dataset, 9)
    ids = np.dtype(np.int32)
    spill = SpillFile(tmp_path if on_disk else None)
    try:
        spilled = concat_spilled([spill_batches(slice_pass(sampled, 0, 4), spill, ids),
                                  spill_batches(empty_pass(1, sampled.num_hops), spill, ids),
                                  spill_batches(slice_pass(sampled, 4, 5), spill, ids)], spill, ids)
        expected = sampled.nodes
        total = len(expected)
        assert int(spilled.node_ptr[-1]) == total and spilled.ram_bytes < 4 * total
        rng = np.random.default_rng(0)
        bounds = [(0, total), (0, 0), (total, total), (int(spilled.node_ptr[4]), int(spilled.node_ptr[5]))]
        bounds += [tuple(sorted(rng.integers(0, total + 1, 2).tolist())) for _ in range(40)]
        for begin, end in bounds:
            got = spilled.node_ids(begin, end)
            assert got.dtype == np.int32 and np.array_equal(got, expected[begin:end])
        with pytest.raises(IndexError):
            spilled.node_ids(0, total + 1)
    finally:
        spill.close()


def test_corrupt_ids_and_corrupt_edges_are_told_apart(straddling_dataset, tmp_path):  # noqa: F811
    sampled = window(straddling_dataset, 3)
    spill = SpillFile(tmp_path, direct=False)
    try:
        spilled = spill_batches(sampled, spill, np.dtype(np.int32))
        n1 = int(np.diff(sampled.node_ptr)[1])
        os.pwrite(spill._fd, b"\xff", spill._base[1] + 4 * n1 + 8 + 4)  # past the ids and their padding: an edge
        os.pwrite(spill._fd, b"\xff", spill._base[2] + 4)  # an id
        with pytest.raises(CorruptData, match="record 1 .* sampled edges"):
            spilled.batch(1)
        assert np.array_equal(spilled.node_ids(0, int(sampled.node_ptr[2])), sampled.nodes[:sampled.node_ptr[2]])
        with pytest.raises(CorruptData, match="record 2 .* sampled ids"):
            spilled.node_ids(0, int(sampled.node_ptr[3]))
        with pytest.raises(CorruptData, match="record 2 .* sampled ids"):
            spilled.batch(2)
    finally:
        spill.close()


def read_through(passes: SampledBatches, bounds: list[tuple[int, int]]) -> list[object]:
    """Everything a stage after the sampler may read of a pass, read through the protocol only."""
    batches = [passes.batch(b) for b in range(passes.num_batches)]
    return [passes.num_batches, passes.num_hops, passes.node_ptr, passes.nodes,
            [passes.node_ids(begin, end) for begin, end in bounds],
            [(batch.nodes, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges) for batch in batches]]


def assert_equal_reads(mine, theirs) -> None:
    """Equal values, whatever the dtype (a spilled pass's ``node_ids`` are int32 here, a pass's in RAM int64)."""
    if isinstance(mine, (list, tuple)):
        assert type(theirs) is type(mine) and len(mine) == len(theirs)
        for m, t in zip(mine, theirs):
            assert_equal_reads(m, t)
    else:
        assert np.array_equal(mine, theirs)


def test_both_pass_types_are_sampled_batches_and_read_alike(straddling_dataset, tmp_path):  # noqa: F811
    """mypy checks the types against the protocol (where each is defined); this checks that every member the protocol
    names is there, with the protocol's parameters, and that both types read the same pass alike through it."""
    members = sorted(name for name in vars(SampledBatches) if not name.startswith("_"))
    assert members == ["batch", "node_ids", "node_ptr", "nodes", "num_batches", "num_hops", "num_sampled_nodes"]
    sampled = window(straddling_dataset, 6)
    spill = SpillFile(tmp_path)
    try:
        spilled = spill_batches(sampled, spill, np.dtype(np.int32))
        for passes in (sampled, spilled):
            for name in members:
                wanted = inspect.getattr_static(SampledBatches, name)
                if inspect.isfunction(wanted):
                    assert inspect.signature(getattr(type(passes), name)).parameters.keys() == \
                        inspect.signature(wanted).parameters.keys(), name
                else:
                    inspect.getattr_static(passes, name)  # a field or a property: AttributeError if missing
        total = int(sampled.node_ptr[-1])
        bounds = [(0, total), (0, 0), (total, total), (3, 3 + int(np.diff(sampled.node_ptr).max())), (1, total - 1)]
        assert_equal_reads(read_through(spilled, bounds), read_through(sampled, bounds))
        for passes in (sampled, spilled):
            with pytest.raises(IndexError):
                passes.node_ids(0, total + 1)
            with pytest.raises(IndexError):
                passes.node_ids(2, 1)
            with pytest.raises(IndexError):
                passes.batch(passes.num_batches)
    finally:
        spill.close()
