"""Pinning the daemon's slots for CUDA (``trainer.host_pinning``, ``DaemonSource.pin_for``) on a machine without a
GPU: a fake CUDA runtime records what would be registered, and when; the copies themselves run in
bench/gpu_check.py on a GPU."""

import logging
import os

import numpy as np
import pytest
import torch

from proto.shm import create_segment, map_segment
from tests.daemon_harness import daemon_config, running_daemon
from trainer.daemon_source import DaemonSource
from trainer.host_pinning import HOST_REGISTER_PORTABLE, HOST_REGISTER_READ_ONLY, buffer_address, pin_region

CUDA = torch.device("cuda")  # a descriptor only: nothing here touches a GPU


class FakeRuntime:
    """Records cudaHostRegister/cudaHostUnregister calls; ``register_error`` != 0 refuses registration."""

    def __init__(self, register_error: int = 0, on_unregister=None) -> None:
        self.register_error = register_error
        self.on_unregister = on_unregister
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr, size, flags):
        self.registered.append((ptr, size, flags))
        return self.register_error

    def cudaHostUnregister(self, ptr):
        if self.on_unregister is not None:
            self.on_unregister()
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def read_only_segment():
    writer = create_segment(3 * 4096 + 100, "test-pinning")
    reader = map_segment(os.dup(writer.reader_fd), writer.nbytes)
    yield reader
    reader.close()
    writer.close()


def test_the_whole_read_only_mapping_is_registered_read_only_and_unregistered_once(read_only_segment):
    runtime = FakeRuntime()
    outcome = pin_region(read_only_segment.mapping, runtime)
    assert outcome.region is not None and outcome.reason == ""
    view = np.frombuffer(read_only_segment.mapping, dtype=np.uint8)
    first_byte = int(view.ctypes.data)
    del view
    assert runtime.registered == [(first_byte, read_only_segment.nbytes,
                                   HOST_REGISTER_PORTABLE | HOST_REGISTER_READ_ONLY)]
    outcome.region.release()
    outcome.region.release()
    assert runtime.unregistered == [first_byte]


def test_taking_the_address_leaves_the_mapping_closable(read_only_segment):
    mapping = read_only_segment.mapping
    assert buffer_address(mapping) != 0
    read_only_segment.close()
    assert mapping.closed  # no numpy export outlived the address: the unmap happened now, not at garbage collection


def test_a_refused_registration_is_a_reason_not_an_error(read_only_segment):
    runtime = FakeRuntime(register_error=801)
    outcome = pin_region(read_only_segment.mapping, runtime)
    assert outcome.region is None
    assert "cudaHostRegister" in outcome.reason and "801" in outcome.reason
    assert runtime.unregistered == []


def test_an_empty_buffer_is_not_registered():
    runtime = FakeRuntime()
    outcome = pin_region(bytearray(), runtime)
    assert outcome.region is None and runtime.registered == []


@pytest.fixture
def daemon(dataset_1500, tmp_path):
    with running_daemon(daemon_config(dataset_1500, tmp_path / "s.sock", memory={"budget": "512M"})) as running:
        yield running


def first_epoch_checksum(source):
    total = 0
    for batch in source.train_batches(0):
        total += int(batch.x.double().sum() * 1000) + int(batch.n_id.sum())
        batch.release()
    return total


def test_a_cuda_session_pins_its_slot_segment_and_unpins_it_before_the_unmap(daemon):
    socket = str(daemon.config.server.socket)
    reference = DaemonSource(socket, timeout=30)
    try:
        want = first_epoch_checksum(reference)
    finally:
        reference.close()
    source = DaemonSource(socket, timeout=30)
    mapped_at_unregister = []
    runtime = FakeRuntime(on_unregister=lambda: mapped_at_unregister.append(not source._client.segment.closed))
    try:
        source.pin_for(torch.device("cpu"), runtime)
        assert runtime.registered == [] and source.pinned_bytes == 0  # a CPU device needs no pinning
        source.pin_for(CUDA, runtime)
        source.pin_for(CUDA, runtime)  # once per session
        segment = source._client.segment
        assert [(size, flags) for _, size, flags in runtime.registered] == [
            (segment.nbytes, HOST_REGISTER_PORTABLE | HOST_REGISTER_READ_ONLY)]
        assert source.pinned_bytes == segment.nbytes
        assert first_epoch_checksum(source) == want
    finally:
        source.close()
    assert runtime.unregistered == [runtime.registered[0][0]]
    assert mapped_at_unregister == [True]


def test_a_refused_registration_warns_once_and_the_session_streams_as_before(daemon, caplog):
    socket = str(daemon.config.server.socket)
    source = DaemonSource(socket, timeout=30)
    runtime = FakeRuntime(register_error=1)
    try:
        with caplog.at_level(logging.WARNING, logger="megabatch.trainer"):
            source.pin_for(CUDA, runtime)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "pageable" in warnings[0] and "CUDA error 1" in warnings[0]
        assert source.pinned_bytes == 0
        assert first_epoch_checksum(source) != 0
    finally:
        source.close()
    assert runtime.unregistered == []


def test_no_pin_slots_leaves_the_segment_unregistered(daemon):
    source = DaemonSource(str(daemon.config.server.socket), timeout=30, pin_slots=False)
    runtime = FakeRuntime()
    try:
        source.pin_for(CUDA, runtime)
    finally:
        source.close()
    assert runtime.registered == [] and source.pinned_bytes == 0
