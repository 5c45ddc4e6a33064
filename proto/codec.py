"""Sans-IO codec of the control protocol: messages to bytes and a byte stream back to messages.

A frame is one msgpack map ``{"t": TAG, field: value, ...}``; frames follow each other on the stream
with no length prefix (msgpack values delimit themselves). The codec does no I/O, so the asyncio
daemon and the blocking trainer client share it.

Against a hostile or broken peer, ``FrameDecoder`` bounds its memory: at most ``max_frame_bytes``
(default ``MAX_FRAME_BYTES`` = 64 KiB) of an unfinished frame are buffered, and msgpack arrays and
maps are limited to ``MAX_CONTAINER_LEN`` (1024) entries, because msgpack preallocates a list of the
declared length when it reads an array header.
"""

from typing import Any

import msgpack

from proto.errors import ProtocolError
from proto.messages import ErrorCode, Message, message_from_map, message_to_map

__all__ = ["MAX_FRAME_BYTES", "MAX_CONTAINER_LEN", "encode", "FrameDecoder", "message_from_map"]

MAX_FRAME_BYTES = 64 * 1024
"""Largest frame a peer may send, in bytes (part of the protocol; a Welcome is well under 4 KiB)."""
MAX_CONTAINER_LEN = 1024
"""Most entries of one msgpack array or map in a frame (e.g. ``Stats.values`` keys)."""


def encode(msg: Message, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """The frame of ``msg``; raises ``ProtocolError("frame_too_large")`` if the peer would refuse it.

    ``max_frame_bytes`` defaults to ``MAX_FRAME_BYTES``.
    """
    data: bytes = msgpack.packb(message_to_map(msg), use_bin_type=True)
    if len(data) > max_frame_bytes:
        raise ProtocolError(ErrorCode.FRAME_TOO_LARGE.value,
                            f"{type(msg).__name__} encodes to {len(data)} bytes, more than {max_frame_bytes}")
    return data


def _message(obj: Any) -> Message:
    try:
        return message_from_map(obj)
    except RecursionError:
        # msgpack nests up to 1023 levels; describing a wrong value that deep (its repr) passes Python's limit
        raise ProtocolError(ErrorCode.BAD_MESSAGE.value, "invalid frame: values nested too deeply") from None


class FrameDecoder:
    """Turns the bytes of a stream, fed in pieces of any size, into messages.

    ``max_frame_bytes`` (default ``MAX_FRAME_BYTES``) bounds one frame. ``feed`` raises
    ``ProtocolError`` with code ``frame_too_large`` (a frame grows past the bound), ``bad_message``
    (not msgpack, not a map, missing or ill-typed field, value out of range) or ``unknown_message``
    (unknown tag). After an error the stream position is lost: messages completed earlier in the same
    ``feed`` are dropped, every later ``feed`` raises the same error (also ``error``), and the caller
    should disconnect.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be >= 1, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self._unpacker = msgpack.Unpacker(
            max_buffer_size=max_frame_bytes, strict_map_key=True, use_list=True, raw=False,
            max_array_len=MAX_CONTAINER_LEN, max_map_len=MAX_CONTAINER_LEN)
        # Stream offsets: bytes fed so far, and where the frame now being parsed began. msgpack's own
        # tell() also counts the consumed part of an unfinished frame, so it cannot bound the frame.
        self._fed = 0
        self._frame_start = 0
        self._error: ProtocolError | None = None

    @property
    def error(self) -> ProtocolError | None:
        """The error that made this decoder unusable, or None."""
        return self._error

    @property
    def pending_bytes(self) -> int:
        """Bytes of the unfinished frame received so far (0 between frames)."""
        return self._fed - self._frame_start

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """The messages completed by ``data``, in stream order; keeps an unfinished frame for later."""
        if self._error is not None:
            raise self._error
        try:
            return self._feed(memoryview(data).cast("B"))
        except ProtocolError as err:
            self._error = err
            raise

    def _feed(self, data: memoryview) -> list[Message]:
        out: list[Message] = []
        while len(data):
            # Feed no more than the current frame may still grow by, so many small frames in one big
            # chunk are fine but one frame can never make the unpacker buffer more than the bound.
            room = self.max_frame_bytes - self.pending_bytes
            if room <= 0:
                raise ProtocolError(ErrorCode.FRAME_TOO_LARGE.value,
                                    f"frame exceeds {self.max_frame_bytes} bytes")
            chunk, data = data[:room], data[room:]
            for obj in self._unpack(chunk):
                out.append(_message(obj))
        return out

    def _unpack(self, chunk: memoryview) -> list[Any]:
        objs: list[Any] = []
        try:
            self._unpacker.feed(chunk)
            self._fed += len(chunk)
            for obj in self._unpacker:
                objs.append(obj)
                self._frame_start = self._unpacker.tell()
        except msgpack.BufferFull:
            raise ProtocolError(ErrorCode.FRAME_TOO_LARGE.value,
                                f"frame exceeds {self.max_frame_bytes} bytes") from None
        except (ValueError, msgpack.UnpackException) as err:
            # msgpack reports a declared str/bin/array/map length above its limits as a ValueError.
            code = ErrorCode.FRAME_TOO_LARGE if "exceeds max_" in str(err) else ErrorCode.BAD_MESSAGE
            raise ProtocolError(code.value, f"invalid msgpack frame: {str(err) or type(err).__name__}") from None
        return objs
