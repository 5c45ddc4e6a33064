"""The trainer's end of the control socket: a blocking client over ``proto.codec`` and ``proto.slots``.

``ControlClient.connect`` performs the handshake of proto/PROTOCOL.md (Hello -> Welcome with the
segment descriptor), maps the slot segment read-only and exposes it as a ``SlotRing``. After that the
caller drives the session with ``send`` and ``recv``; ``read_batch`` turns a ``BatchReady`` into views of
its slot. ``send`` may be called from any thread (frames are never interleaved); ``recv`` from one
thread at a time. A daemon that stops sends ``Shutdown``: ``recv`` raises ``DaemonShuttingDown`` for
it, and so does a ``send`` that fails because the daemon then closed the connection.
"""

import collections
import math
import os
import select
import socket
import threading
import time
from dataclasses import dataclass

from proto.codec import FrameDecoder, encode
from proto.errors import ConnectFailed, ConnectionClosed, ProtocolError, RemoteError, SlotError
from proto.messages import PROTOCOL_VERSION, BatchReady, Bye, Error, ErrorCode, Hello, Message, Shutdown, Welcome
from proto.shm import Segment, map_segment, recv_with_fds
from proto.slots import SlotContents, SlotRing

__all__ = ["DEFAULT_TIMEOUT", "RECV_BYTES", "ControlClient", "DaemonShuttingDown", "JobMember"]

DEFAULT_TIMEOUT = 30.0
"""Seconds ``connect`` waits for the connection and the Welcome by default."""
RECV_BYTES = 64 * 1024
"""Bytes asked of one ``recv`` call."""


@dataclass(frozen=True)
class JobMember:
    """Which rank of a training job a client is (the job fields of ``Hello``); the default: a lone trainer."""

    job: str = ""
    rank: int = 0
    world_size: int = 1
    local_world_size: int = 1


class DaemonShuttingDown(ConnectionClosed):
    """The daemon sent ``Shutdown``: it is stopping and closes the session once the batches already
    announced are released (or its drain timeout passes). ``reason`` is the daemon's text."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the loader daemon is shutting down: {reason or 'no reason given'}")
        self.reason = reason


def _connect_error(path: str, err: OSError) -> ConnectFailed:
    if isinstance(err, FileNotFoundError):
        reason = "no such file (is `megabatch serve` running?)"
    elif isinstance(err, ConnectionRefusedError):
        reason = "connection refused (stale socket file? is `megabatch serve` running?)"
    elif isinstance(err, PermissionError):
        reason = "permission denied (check the owner and mode of the socket and its directory)"
    elif isinstance(err, TimeoutError):
        reason = "timed out"
    else:
        reason = os.strerror(err.errno) if err.errno else str(err)
    return ConnectFailed(f"cannot connect to loader daemon at {path}: {reason}")


class ControlClient:
    """A connected, handshaken session with the loader daemon.

    Attributes: ``welcome`` (the daemon's ``Welcome``), ``segment`` (the read-only mapping of the slot
    segment) and ``ring`` (a ``SlotRing`` over it). Build one with ``connect`` or ``handshake``.
    """

    def __init__(self, sock: socket.socket, welcome: Welcome, segment: Segment, decoder: FrameDecoder,
                 pending: list[Message]) -> None:
        self.welcome = welcome
        self.segment = segment
        self.ring = SlotRing.from_layout(segment.mapping, welcome.slots)
        self._sock = sock
        self._decoder = decoder
        self._pending = collections.deque(pending)
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self.closed = False
        self.shutdown_reason: str | None = None
        """The reason of the daemon's ``Shutdown`` once one was received (None before)."""

    @classmethod
    def connect(cls, path: str, *, client: str, timeout: float | None = DEFAULT_TIMEOUT,
                feature_cache_bytes: int = 0, job: JobMember | None = None, queue: bool = False,
                aggregation: bool = False, micro_batches: int = 0, task: str = "node") -> "ControlClient":
        """Connect to the daemon's Unix socket at ``path`` and handshake (see ``handshake``).

        ``timeout`` (default ``DEFAULT_TIMEOUT``; None waits forever) bounds the connection and the
        handshake. Raises ``ConnectFailed`` with a one-line reason when the socket cannot be reached.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as err:
            sock.close()
            raise _connect_error(path, err) from None
        return cls.handshake(sock, client=client, timeout=timeout, feature_cache_bytes=feature_cache_bytes, job=job,
                             queue=queue, aggregation=aggregation, micro_batches=micro_batches, task=task)

    @classmethod
    def handshake(cls, sock: socket.socket, *, client: str, timeout: float | None = DEFAULT_TIMEOUT,
                  feature_cache_bytes: int = 0, job: JobMember | None = None, queue: bool = False,
                  aggregation: bool = False, micro_batches: int = 0, task: str = "node") -> "ControlClient":
        """Run the handshake on the connected stream socket ``sock``, which the client then owns.

        Sends ``Hello(PROTOCOL_VERSION, client, pid, feature_cache_bytes)`` (default 0: no client
        feature cache; ``welcome.feature_cache_rows`` says what the daemon accepted; with ``job``, the Hello's
        job fields: ``welcome.job`` is then the job's name, or "" from a daemon that does not deal to
        ranks; ``queue``: wait for a busy training pipeline, hearing ``Queued``, instead of a refusal;
        ``aggregation``: the client reads batches carrying ``x_agg``; ``micro_batches``: the daemon groups each
        training batch's seeds for that many micro-batches; ``task``: "link" for a link-prediction client) and
        waits up to ``timeout`` seconds
        (default ``DEFAULT_TIMEOUT``) for the Welcome and its segment descriptor.
        Raises ``RemoteError`` if the daemon answers with an Error (e.g. ``busy``), ``ConnectionClosed`` if it hangs up,
        ``ProtocolError`` for anything else than a valid Welcome of this protocol version carrying one
        descriptor, ``ShmError`` if the segment cannot be mapped, ``TimeoutError`` on timeout. ``sock``
        is closed on every failure.
        """
        fds: list[int] = []
        try:
            sock.settimeout(timeout)
            member = job if job is not None else JobMember()
            sock.sendall(encode(Hello(PROTOCOL_VERSION, client, os.getpid(), feature_cache_bytes, job=member.job,
                                      rank=member.rank, world_size=member.world_size,
                                      local_world_size=member.local_world_size, queue=queue,
                                      aggregation=aggregation, micro_batches=micro_batches, task=task)))
            decoder = FrameDecoder()
            messages: list[Message] = []
            while not messages:
                data, received = recv_with_fds(sock, RECV_BYTES, 1)
                fds.extend(received)
                if not data:
                    raise ConnectionClosed("the loader daemon closed the connection during the handshake")
                messages = decoder.feed(data)
            welcome = messages[0]
            if isinstance(welcome, Error):
                raise RemoteError(welcome.code, welcome.message)
            if not isinstance(welcome, Welcome):
                raise ProtocolError(ErrorCode.BAD_MESSAGE.value, f"expected a Welcome, got {type(welcome).__name__}")
            if welcome.protocol_version != PROTOCOL_VERSION:
                raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION.value,
                                    f"the loader daemon speaks protocol version {welcome.protocol_version}, "
                                    f"this client {PROTOCOL_VERSION}")
            if len(fds) != 1:
                raise ProtocolError(ErrorCode.BAD_MESSAGE.value,
                                    f"the Welcome carried {len(fds)} descriptors, expected the segment's one")
            segment = map_segment(fds.pop(), welcome.slots.segment_bytes)
            try:
                result = cls(sock, welcome, segment, decoder, messages[1:])
            except SlotError as err:
                segment.close()
                raise ProtocolError(ErrorCode.BAD_MESSAGE.value, f"Welcome.slots: {err}") from None
            sock.settimeout(None)  # recv waits with poll, so a timeout there never affects send
            return result
        except BaseException as err:
            for fd in fds:
                os.close(fd)
            sock.close()
            if isinstance(err, TimeoutError):
                raise TimeoutError(f"no Welcome from the loader daemon within {timeout} s") from None
            if isinstance(err, ConnectionResetError | BrokenPipeError):
                raise ConnectionClosed(f"the loader daemon closed the connection during the handshake: {err}") \
                    from None
            raise

    def send(self, msg: Message) -> None:
        """Send one message (thread-safe); raises ``ConnectionClosed`` if the daemon is gone, or ``RemoteError``
        when it said why before it closed (the fatal ``Error`` it sent is among the bytes not read yet)."""
        frame = encode(msg)
        with self._send_lock:
            try:
                self._sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError) as err:
                raise self._closed_error(err) from None

    def _closed_error(self, err: OSError) -> ConnectionClosed | RemoteError:
        """Why the connection is gone, from the bytes not read yet (when no other thread is in ``recv``):
        the daemon's fatal ``Error`` (a ``data_corrupt`` or ``timeout`` it sent just before closing,
        while the client was still sending), else ``DaemonShuttingDown`` after a ``Shutdown``, else
        ``ConnectionClosed``."""
        if self._recv_lock.acquire(blocking=False):
            try:
                while True:
                    try:
                        data = self._sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
                    except OSError:
                        break
                    if not data:
                        break
                    try:
                        self._pending.extend(self._decoder.feed(data))
                    except ProtocolError:
                        break
                self._note_shutdown()
                for msg in self._pending:
                    if isinstance(msg, Error) and msg.code != "bad_request":
                        return RemoteError(msg.code, msg.message)
            finally:
                self._recv_lock.release()
        if self.shutdown_reason is not None:
            return DaemonShuttingDown(self.shutdown_reason)
        return ConnectionClosed(f"the loader daemon closed the connection: {err}")

    def _note_shutdown(self) -> None:
        for msg in self._pending:
            if isinstance(msg, Shutdown):
                self.shutdown_reason = msg.reason
                return

    def recv(self, timeout: float | None = None) -> Message:
        """The next message from the daemon, waiting up to ``timeout`` seconds (default None: forever).

        Raises ``RemoteError`` for an ``Error`` message (the session goes on only if ``not err.fatal``),
        ``DaemonShuttingDown`` for a ``Shutdown`` (and at end of stream after one; the batches already
        announced stay readable and ``send(Release(...))`` still works until the daemon closes),
        ``ConnectionClosed`` at end of stream, ``ProtocolError`` for an invalid frame, ``TimeoutError``
        when nothing complete arrives in time. A ``Bye`` is returned like any message.
        """
        with self._recv_lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._pending:
                if self._decoder.error is not None:
                    raise self._decoder.error
                if deadline is not None and not self._wait_readable(deadline - time.monotonic()):
                    raise TimeoutError(f"no message from the loader daemon within {timeout} s")
                try:
                    data = self._sock.recv(RECV_BYTES)
                except ConnectionResetError as err:
                    if self.shutdown_reason is not None:
                        raise DaemonShuttingDown(self.shutdown_reason) from None
                    raise ConnectionClosed(f"the loader daemon closed the connection: {err}") from None
                if not data:
                    if self.shutdown_reason is not None:
                        raise DaemonShuttingDown(self.shutdown_reason)
                    raise ConnectionClosed("the loader daemon closed the connection")
                self._pending.extend(self._decoder.feed(data))
            msg = self._pending.popleft()
        if isinstance(msg, Error):
            raise RemoteError(msg.code, msg.message)
        if isinstance(msg, Shutdown):
            self.shutdown_reason = msg.reason
            raise DaemonShuttingDown(msg.reason)
        return msg

    def _wait_readable(self, seconds: float) -> bool:
        if seconds <= 0:
            return False
        poller = select.poll()  # not select(): it fails on descriptors above 1023
        poller.register(self._sock, select.POLLIN)
        return bool(poller.poll(math.ceil(seconds * 1000)))

    def read_batch(self, ready: BatchReady) -> SlotContents:
        """Zero-copy views of the batch ``ready`` announced; ``SlotError`` if the slot does not hold it."""
        contents = self.ring.read(ready.slot, expect_seq=ready.seq)
        if contents.batch_id != ready.batch_id:
            raise SlotError(f"slot {ready.slot} header names {contents.batch_id}, which does not match its "
                            f"BatchReady {ready.batch_id}")
        return contents

    def close(self, reason: str = "") -> None:
        """Send ``Bye(reason)`` if the socket takes it without blocking, then disconnect and unmap (idempotent).

        Views of slots still held stay readable: the mapping goes when the last one is collected.
        """
        if self.closed:
            return
        self.closed = True
        try:
            with self._send_lock:
                self._sock.send(encode(Bye(reason)), socket.MSG_DONTWAIT)
        except OSError:
            pass  # best effort: the daemon treats a plain disconnect the same way
        self._sock.close()
        self.ring.close()
        self.segment.close()

    def __enter__(self) -> "ControlClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
