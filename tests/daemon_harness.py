"""Run a loader daemon inside the test process (its own thread and uvloop loop) and build datasets for it.

In-process keeps numba's compiled kernels across tests; readiness and shutdown are events, never sleeps.
"""

import asyncio
import contextlib
import dataclasses
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

from loader.daemon.config import LoaderConfig, config_from_mapping
from loader.daemon.server import Daemon
from loader.offline.generate import generate_graph
from loader.offline.prepare import PrepareOptions, prepare_dataset
from proto.batch_arrays import BatchArrays
from proto.client import ControlClient
from proto.codec import FrameDecoder
from proto.errors import RemoteError
from proto.messages import BatchReady, Credit, Message, Queued, Release, StartEpoch

__all__ = ["small_dataset", "daemon_config", "running_daemon", "connect", "consume", "read_message",
           "train_until_error"]

BATCH_ARRAY_NAMES = [field.name for field in dataclasses.fields(BatchArrays)]
"""The arrays a batch may carry, in ``BatchArrays``' order (PROTOCOL.md's names)."""


def small_dataset(root: Path, *, nodes: int = 3000, partitions: int = 16, feat_dim: int = 16, classes: int = 4,
                  avg_degree: float = 10, seed: int = 0, partitioner: str = "metis",
                  feat_dtype: str | None = None) -> Path:
    raw = generate_graph(root / "raw", num_nodes=nodes, avg_degree=avg_degree, feat_dim=feat_dim,
                         num_classes=classes, seed=seed, progress=False)
    out = root / "dataset"
    prepare_dataset(raw.path, out, PrepareOptions(num_partitions=partitions, partitioner=partitioner,
                                                  memory_budget=256 << 20, progress=False, feat_dtype=feat_dtype))
    return out


def daemon_config(dataset: Path, socket: Path, **tables: dict[str, Any]) -> LoaderConfig:
    """A config for tests: metrics off, small budget; ``tables`` override whole TOML tables' keys."""
    data: dict[str, Any] = {
        "dataset": {"path": str(dataset)}, "memory": {"budget": "256M"},
        "hierarchy": {"megabatch_fraction": 0.25, "passes": 1},
        "sampler": {"batch_size": 64, "fanouts": [5, 3], "eval_batch_size": 128, "seed": 0},
        "publisher": {"slots": 3}, "server": {"socket": str(socket), "max_clients": 4},
        "metrics": {"port": 0},
    }
    for name, values in tables.items():
        data.setdefault(name, {}).update(values)
    return config_from_mapping(data)


@contextmanager
def running_daemon(config: LoaderConfig) -> Iterator[Daemon]:
    """Start a daemon on a thread, yield it once it accepts connections, stop it on exit."""
    daemon = Daemon(config)
    ready = threading.Event()
    loop_box: list[asyncio.AbstractEventLoop] = []
    failure: list[BaseException] = []

    async def main() -> None:
        loop_box.append(asyncio.get_running_loop())

        async def signal_ready() -> None:
            await daemon.ready.wait()
            ready.set()

        waiter = asyncio.ensure_future(signal_ready())
        try:
            await daemon.serve()
        finally:
            waiter.cancel()

    def thread_main() -> None:
        try:
            uvloop.run(main())
        except BaseException as err:  # surfaced to the test below
            failure.append(err)
        finally:
            ready.set()

    thread = threading.Thread(target=thread_main, name="test-daemon", daemon=True)
    thread.start()
    ready.wait()
    if failure:
        thread.join()
        raise failure[0]
    try:
        yield daemon
    finally:
        # a daemon that ended by itself (a drain that finished, a fatal error) has closed its loop already
        with contextlib.suppress(RuntimeError):
            loop_box[0].call_soon_threadsafe(daemon.should_exit.set)
        thread.join(timeout=60)
        if failure:
            raise failure[0]


def connect(config: LoaderConfig, *, queue: bool = False) -> ControlClient:
    """A client of the daemon of ``config`` that has granted all its slots (``queue``: it waits its turn for a
    busy training pipeline instead of being refused)."""
    client = ControlClient.connect(str(config.server.socket), client="test", timeout=30, queue=queue)
    client.send(Credit(count=client.welcome.slots.count))
    return client


def consume(client: ControlClient, request: Message, end_type: type
            ) -> tuple[list[tuple[BatchReady, dict[str, np.ndarray]]], Any]:
    """All batches of one stream as copies: (ready, arrays by name); releases every slot after reading it.

    Each batch is read as a trainer reads it, through the wire reader (``BatchArrays.read``: a batch whose
    arrays contradict each other fails the test with the ``SlotError``), and the arrays are copied from what
    the reader returns: its six arrays, and the three of a feature cache plan when the batch carries one."""
    client.send(request)
    batches = []
    while True:
        msg = client.recv(timeout=60)
        if isinstance(msg, Queued):  # a queueing client's place in line, before its stream starts
            continue
        if isinstance(msg, BatchReady):
            batch = BatchArrays.read(client.read_batch(msg).arrays, client.welcome.feature_cache_rows)
            arrays = {name: np.array(value) for name in BATCH_ARRAY_NAMES
                      if (value := getattr(batch, name)) is not None}
            batches.append((msg, arrays))
            client.send(Release(slot=msg.slot, seq=msg.seq))
        else:
            assert isinstance(msg, end_type), msg
            assert msg.batches == len(batches)
            return batches, msg


def train_until_error(client: ControlClient) -> RemoteError:
    """Start epoch 0 and release every batch until the daemon's ``Error`` ends the stream; that error."""
    client.send(StartEpoch(epoch=0))
    try:
        while True:
            msg = client.recv(timeout=60)
            assert isinstance(msg, BatchReady), msg
            client.send(Release(slot=msg.slot, seq=msg.seq))
    except RemoteError as err:
        return err


def read_message(sock: socket.socket) -> Message | None:
    """The daemon's next message on a raw socket, or None at end of stream."""
    decoder = FrameDecoder()
    messages: list[Message] = []
    while not messages:
        data = sock.recv(65536)
        if not data:
            return None
        messages = decoder.feed(data)
    return messages[0]
