"""Every message of the control protocol, one frozen dataclass each (spec: proto/PROTOCOL.md).

Each message class has a wire tag ``TAG`` and a ``SENDER`` ("client", "daemon" or "either").
Fields are plain types only: ``int``, ``float``, ``str``, ``bool``, ``list[int]``, ``list[str]``,
``dict[str, ...]`` of those, and the nested records ``DatasetInfo`` and ``SlotLayout``.

Messages validate in their constructor: a field of the wrong type (``bool`` is not an ``int``; an
``int`` is accepted for a ``float`` and converted), an integer out of its range (every integer fits
in int64; counts and indices are non-negative; slot-header fields fit their header width) or a string
outside its choices raises ``ProtocolError("bad_message", ...)`` naming the message, the field and the
value. ``proto.codec.message_from_map`` relies on this, so a decoded message is always valid.
"""

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from proto.errors import ProtocolError

__all__ = [
    "PROTOCOL_VERSION", "ErrorCode", "SPLITS", "KINDS", "FEATURE_DTYPES", "TASKS", "LINK_ORDERS", "Record", "Message",
    "DatasetInfo",
    "SlotLayout", "Hello", "Welcome", "Credit", "StartEpoch", "EvalRequest", "BatchId", "BatchReady", "Release",
    "EpochEnd", "EvalEnd", "StatsRequest", "Stats", "Error", "Bye", "Shutdown", "Queued", "MESSAGE_TYPES",
    "message_from_map",
    "message_to_map",
]

PROTOCOL_VERSION = 1
"""Major protocol version; peers with different versions refuse each other (``unsupported_version``)."""


class ErrorCode(enum.StrEnum):
    """Codes of ``Error`` messages (and of ``ProtocolError``). Every code but ``BAD_REQUEST`` is fatal."""

    BAD_MESSAGE = "bad_message"
    """A frame is not a valid message: not msgpack, not a map, missing tag or field, wrong type or range."""
    UNKNOWN_MESSAGE = "unknown_message"
    """A frame's tag names no message of this protocol version."""
    FRAME_TOO_LARGE = "frame_too_large"
    """A frame exceeds the maximum frame size (``proto.codec.MAX_FRAME_BYTES``)."""
    UNSUPPORTED_VERSION = "unsupported_version"
    """``Hello.protocol_version`` (or ``Welcome.protocol_version``) differs from the receiver's."""
    BUSY = "busy"
    """The daemon takes no more sessions now (its session limit is reached or it is shutting down)."""
    BAD_REQUEST = "bad_request"
    """A well-formed request that is wrong in the current state; the daemon ignores it, the session goes on."""
    INTERNAL = "internal"
    """The sender failed (a bug or an I/O error); the message says what happened."""
    FORBIDDEN = "forbidden"
    """The daemon does not admit this peer (its uid and groups are outside the daemon's allow lists).
    Added in a compatible revision of version 1: older clients treat it, like any unknown code, as fatal."""
    TIMEOUT = "timeout"
    """The daemon evicts a session that stalled a stream, sat idle holding the training pipeline, or left
    its replies unread for too long (compatible revision of version 1, like ``FORBIDDEN``)."""
    DATA_CORRUPT = "data_corrupt"
    """Bytes the daemon read for this stream failed the dataset's read checks; the message names the file and
    byte offset, and nothing of the failed batch was published (compatible revision of version 1)."""
    JOB_FAILED = "job_failed"
    """The training job this session is a rank of failed (another rank left or stalled mid-epoch, the ranks
    did not all connect within the daemon's job timeout, or they disagree); the message says which
    (compatible revision of version 1)."""


SPLITS = ("val", "test")
"""Evaluation splits an ``EvalRequest`` and ``EvalEnd`` may name."""
KINDS = ("train", "val", "test")
"""Stream kinds a ``BatchReady`` may carry (``"train"`` for ``StartEpoch`` streams)."""
FEATURE_DTYPES = ("float32", "float16")
"""Feature dtypes a dataset may have (the prepared-dataset format's ``FeatureDtype``)."""
TASKS = ("node", "link")
"""What a dataset is trained for (``DatasetInfo.task``, ``Hello.task``): node classification or link prediction."""
LINK_ORDERS = ("shuffled", "comet", "beta")
"""The order a link dataset's training edges follow (``DatasetInfo.link_order``): shuffled over the whole graph, or
one of MariusGNN's partition buffer orders."""

_I64 = (-(2**63), 2**63 - 1)
_COUNT = {"range": (0, 2**63 - 1)}
_U32 = {"range": (0, 2**32 - 1)}
_BATCHES = {"range": (-1, 2**31 - 1)}  # i32 in the slot header; -1 = not known
_POSITIVE = {"range": (1, 2**63 - 1)}
_FANOUT = {"item_range": (-1, 2**31 - 1)}  # -1 = all neighbours (the PyG convention)
_COUNTS = {"item_range": (0, 2**63 - 1)}


def _fail(where: str, problem: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE.value, f"{where}: {problem}")


def _check(value: Any, tp: Any, where: str) -> Any:
    """``value`` normalized to ``tp`` (int -> float for float fields, str subclasses -> str), or raise."""
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not _I64[0] <= value <= _I64[1]:
                raise _fail(where, f"integer {value} does not fit in int64")
            return int(value)
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise _fail(where, f"integer {value} is too large for a float") from None
    elif tp is str:
        if isinstance(value, str):
            return str(value)
    elif isinstance(tp, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _check(value, option, where)
            except ProtocolError:
                continue
    elif typing.get_origin(tp) is list:
        if isinstance(value, list | tuple):
            (item_tp,) = typing.get_args(tp)
            return [_check(item, item_tp, f"{where}[{i}]") for i, item in enumerate(value)]
    elif typing.get_origin(tp) is dict:
        if isinstance(value, dict):
            key_tp, value_tp = typing.get_args(tp)
            return {_check(k, key_tp, f"{where} key {k!r}"): _check(v, value_tp, f"{where}[{k!r}]")
                    for k, v in value.items()}
    elif isinstance(tp, type) and issubclass(tp, Record):
        if isinstance(value, tp):
            return value
    else:  # pragma: no cover - a field type this module does not support is a bug here
        raise TypeError(f"{where}: unsupported field type {tp!r}")
    raise _fail(where, f"expected {_type_name(tp)}, got {type(value).__name__} {_short(value)}")


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Record:
    """Base of every message and nested record: validates and normalizes fields after construction.

    Field metadata ``range`` (inclusive integer bounds), ``item_range`` (bounds of each list item) and
    ``choices`` (allowed strings) add constraints to the type check.
    """

    def __post_init__(self) -> None:
        name = type(self).__name__
        for f in dataclasses.fields(self):
            where = f"{name}.{f.name}"
            value = _check(getattr(self, f.name), f.type, where)
            if "range" in f.metadata:
                lo, hi = f.metadata["range"]
                if not lo <= value <= hi:
                    raise _fail(where, f"{value} is outside [{lo}, {hi}]")
            if "item_range" in f.metadata:
                lo, hi = f.metadata["item_range"]
                for i, item in enumerate(value):
                    if not lo <= item <= hi:
                        raise _fail(f"{where}[{i}]", f"{item} is outside [{lo}, {hi}]")
            if "choices" in f.metadata and value not in f.metadata["choices"]:
                raise _fail(where, f"{value!r} is not one of {', '.join(f.metadata['choices'])}")
            object.__setattr__(self, f.name, value)  # the normalized value (frozen dataclass)


@dataclass(frozen=True)
class Message(Record):
    """Base of the wire messages. ``TAG`` is the value of the frame's ``"t"`` key."""

    TAG: ClassVar[str] = ""
    SENDER: ClassVar[str] = ""


@dataclass(frozen=True)
class DatasetInfo(Record):
    """What the trainer needs to know about the served dataset and batching (inside ``Welcome``)."""

    name: str
    num_nodes: int = field(metadata=_COUNT)
    num_features: int = field(metadata=_COUNT)
    feature_dtype: str = field(metadata={"choices": FEATURE_DTYPES})
    num_classes: int = field(metadata=_COUNT)
    num_hops: int = field(metadata=_COUNT)
    """GNN layers the batches support; ``len(fanouts) == num_hops``. Batches sample that many hops, one fewer
    where they carry ``x_agg`` (``aggregation``)."""
    fanouts: list[int] = field(metadata=_FANOUT)
    """Neighbours sampled per hop for training, hop 1 first; -1 means all neighbours."""
    eval_fanouts: list[int] = field(metadata=_FANOUT)
    """The same for evaluation streams (often all -1)."""
    batch_size: int = field(metadata=_POSITIVE)
    """Seed nodes per batch (the last batch of a stream may have fewer)."""
    train_nodes: int = field(metadata=_COUNT)
    val_nodes: int = field(metadata=_COUNT)
    test_nodes: int = field(metadata=_COUNT)
    mode: str
    """Batching mode the daemon runs (free-form, for logs): its ``[loader] mode``, e.g. ``"hierarchical"``
    or ``"exact"``."""
    aggregation: str = ""
    """The dataset's aggregation cache the batches carry as ``x_agg`` ("mean", "sum" or "gcn"; "" = none, and an
    older daemon's value): training batches then sample ``num_hops - 1`` hops (``fanouts[:-1]``) and the model's
    first layer reads each node's ``x_agg`` row instead of a last sampled hop."""
    eval_aggregation: bool = False
    """With ``aggregation``: evaluation batches are built the same way (False: they sample every hop of
    ``eval_fanouts`` and carry no ``x_agg``)."""
    task: str = field(default="node", metadata={"choices": TASKS})
    """"node" (default, and every older daemon's): node classification. "link": link prediction; training batches
    carry ``edge_label_index``/``edge_label`` (``batch_size`` positives each, ``link_negatives`` negatives per
    positive), evaluation batches embed a split's held-out nodes and carry its pairs (``pair_index``/``pair_tails``)."""
    link_negatives: int = field(default=0, metadata=_COUNT)
    """Link prediction: training negatives per positive (``[link] negatives``)."""
    link_disjoint: bool = False
    """Link prediction: a training batch's positive edges are dropped from its own message passing."""
    link_eval_negatives: int = field(default=0, metadata=_COUNT)
    """Link prediction: fixed negative tails per held-out positive (the ``pair_tails`` columns)."""
    link_positives: list[int] = field(default_factory=list, metadata=_COUNTS)
    """Link prediction: positives of the train, val and test splits, in that order ([] for a node dataset)."""
    link_order: str = field(default="shuffled", metadata={"choices": LINK_ORDERS})
    """Link prediction: the order the training edges follow, "shuffled" (every full-graph mode, a buffer of every
    partition, and an older daemon) or the hierarchical mode's partition buffer order, "comet" or "beta"; the
    trainer's default learning rate depends on it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("fanouts", "eval_fanouts"):
            if len(getattr(self, name)) != self.num_hops:
                raise _fail(f"DatasetInfo.{name}", f"has {len(getattr(self, name))} entries, "
                                                   f"expected num_hops = {self.num_hops}")


@dataclass(frozen=True)
class SlotLayout(Record):
    """Shape of the shared-memory slot ring (inside ``Welcome``); the binary layout is in PROTOCOL.md.

    Checked here: structure only (``count >= 1``, ``header_bytes < slot_bytes``, the segment holds every
    slot). Alignment and the minimum header size are checked by ``proto.slots.SlotRing``.
    """

    count: int = field(metadata=_POSITIVE)
    """Number of slots; slot ``i`` starts at byte ``i * slot_bytes`` of the segment."""
    slot_bytes: int = field(metadata=_POSITIVE)
    header_bytes: int = field(metadata=_POSITIVE)
    segment_bytes: int = field(metadata=_POSITIVE)
    """Bytes the client maps from the passed fd (at least ``count * slot_bytes``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.header_bytes >= self.slot_bytes:
            raise _fail("SlotLayout.header_bytes", f"{self.header_bytes} leaves no room in a "
                                                   f"{self.slot_bytes}-byte slot")
        if self.segment_bytes < self.count * self.slot_bytes:
            raise _fail("SlotLayout.segment_bytes", f"{self.segment_bytes} is less than count * slot_bytes = "
                                                    f"{self.count * self.slot_bytes}")


@dataclass(frozen=True)
class Hello(Message):
    """Client -> daemon, the first message of a session.

    ``protocol_version`` is frozen across protocol versions; only optional fields (with a default)
    are ever added, so any two versions can still refuse each other cleanly.
    """

    TAG: ClassVar[str] = "hello"
    SENDER: ClassVar[str] = "client"
    protocol_version: int
    client: str
    """Free-form client description for logs, e.g. ``"trainer 0.1.0 rank 0"``."""
    pid: int = field(metadata=_COUNT)
    feature_cache_bytes: int = field(default=0, metadata=_COUNT)
    """Bytes of feature rows the client can cache (its trainer-side cache); 0 (default) = no cache.
    In bytes, not rows: the client learns the row size only from the Welcome. The daemon answers
    with the rows it accepts in ``Welcome.feature_cache_rows``."""
    job: str = ""
    """A training job of several ranks (torch.distributed) that this client is one rank of; "" (default)
    = a trainer alone. Every rank of a job that uses this daemon sends the same ``job``, ``world_size``
    and ``local_world_size``; the daemon waits for all of them and deals each epoch to them."""
    rank: int = field(default=0, metadata=_COUNT)
    """This client's rank in the job, in [0, ``world_size``)."""
    world_size: int = field(default=1, metadata=_POSITIVE)
    """Ranks in the whole job, on every machine."""
    local_world_size: int = field(default=1, metadata=_POSITIVE)
    """Ranks of the job that connect to this daemon (torchrun's LOCAL_WORLD_SIZE)."""
    queue: bool = False
    """The client waits in the daemon's training queue (``Queued`` tells it its place) when another trainer
    holds the training pipeline; False (default, and every older client): such a StartEpoch is refused
    with ``Error("bad_request")`` at once."""
    micro_batches: int = field(default=0, metadata=_COUNT)
    """The client cuts each training batch into this many micro-batches (Betty): the daemon then groups each
    training batch's seeds by REG + METIS and sends the groups (``seed_group``), so the client runs no METIS;
    0 or 1 (default, and every older client): no groups."""
    aggregation: bool = False
    """The client reads ``x_agg`` (``DatasetInfo.aggregation``); False (default, and every older client): a daemon
    whose batches carry it refuses the session with ``Error("bad_request")``, since such a client would build a
    model one layer short."""
    task: str = field(default="node", metadata={"choices": TASKS})
    """The task the client trains ("node", the default and every older client's, or "link"); a daemon whose dataset
    is of the other task refuses the session with ``Error("bad_request")``."""


@dataclass(frozen=True)
class Welcome(Message):
    """Daemon -> client, the answer to ``Hello``; the segment fd travels with it (SCM_RIGHTS)."""

    TAG: ClassVar[str] = "welcome"
    SENDER: ClassVar[str] = "daemon"
    protocol_version: int
    daemon_version: str
    session: int = field(metadata=_COUNT)
    """Session id, unique while the daemon runs (for logs and metrics)."""
    dataset: DatasetInfo
    slots: SlotLayout
    feature_cache_rows: int = field(default=0, metadata=_COUNT)
    """Rows of the client's feature cache the daemon plans for (0 = none: training slots carry every
    row). At most ``Hello.feature_cache_bytes`` // (``num_features`` x item size) and at most
    ``num_nodes``; a daemon without the feature leaves it out (0)."""
    job: str = ""
    """``Hello.job`` as the daemon accepted it; a daemon that does not know jobs leaves it out (""), and
    a client of a job must then refuse to train (the daemon would not deal to its ranks)."""
    dealing: str = ""
    """A fingerprint of everything that decides which seeds and samples an epoch's batches hold (the
    dataset's manifest checksum, the mode and its mega-batch grouping, the sampler settings): the daemons
    of a job spanning machines must agree on it, which their ranks check; "" from an older daemon."""


@dataclass(frozen=True)
class Credit(Message):
    """Client -> daemon: allow ``count`` more batches in flight (0 is a no-op)."""

    TAG: ClassVar[str] = "credit"
    SENDER: ClassVar[str] = "client"
    count: int = field(metadata=_COUNT)


@dataclass(frozen=True)
class StartEpoch(Message):
    """Client -> daemon: stream the training batches of ``epoch`` (0-based; deterministic per epoch)."""

    TAG: ClassVar[str] = "start_epoch"
    SENDER: ClassVar[str] = "client"
    epoch: int = field(metadata=_U32)


@dataclass(frozen=True)
class EvalRequest(Message):
    """Client -> daemon: stream batches covering every node of ``split`` ("val" or "test") once."""

    TAG: ClassVar[str] = "eval_request"
    SENDER: ClassVar[str] = "client"
    split: str = field(metadata={"choices": SPLITS})


@dataclass(frozen=True)
class BatchReady(Message):
    """Daemon -> client: slot ``slot`` holds batch ``seq``; the client owns the slot until ``Release``."""

    TAG: ClassVar[str] = "batch_ready"
    SENDER: ClassVar[str] = "daemon"
    slot: int = field(metadata=_COUNT)
    seq: int = field(metadata=_COUNT)
    """0 for the session's first batch, +1 for every BatchReady after it, across streams."""
    kind: str = field(metadata={"choices": KINDS})
    epoch: int = field(metadata=_U32)
    """The training epoch; for eval streams the epoch of the session's last StartEpoch (0 if none)."""
    pass_index: int = field(metadata=_U32)
    """Pass over the training nodes within the epoch (0 for eval streams)."""
    batch_index: int = field(metadata=_U32)
    """Position of the batch in its stream, from 0."""
    num_batches: int = field(metadata=_BATCHES)
    """Batches in this stream when known, else -1."""
    global_seeds: int = field(default=0, metadata=_COUNT)
    """Training batches of a job of several ranks: the seeds of the global batch this piece belongs to,
    over every rank (the loss scale); 0 (default) otherwise. Not stored in the slot header."""

    @classmethod
    def announce(cls, slot: int, batch: "BatchId", global_seeds: int = 0) -> "BatchReady":
        """The announcement of ``batch`` in ``slot``."""
        return cls(slot=slot, seq=batch.seq, kind=batch.kind, epoch=batch.epoch, pass_index=batch.pass_index,
                   batch_index=batch.batch_index, num_batches=batch.num_batches, global_seeds=global_seeds)

    @property
    def batch_id(self) -> "BatchId":
        """The batch this announces, as its slot's header should store it."""
        return BatchId(kind=self.kind, seq=self.seq, epoch=self.epoch, pass_index=self.pass_index,
                       batch_index=self.batch_index, num_batches=self.num_batches)


@dataclass(frozen=True)
class BatchId:
    """Which batch a slot holds: what ``BatchReady`` announces besides the slot, and what the slot's
    header stores (proto/PROTOCOL.md, "Slot header"), built once so the two cannot disagree.

    ``kind`` is "train", "val" or "test"; ``num_batches`` is -1 when the stream length is not known.
    """

    kind: str
    seq: int
    epoch: int
    pass_index: int
    batch_index: int
    num_batches: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"BatchId.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for f in dataclasses.fields(BatchReady):
            if f.name in ("slot", "kind", "global_seeds"):
                continue
            lo, hi = f.metadata["range"]
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"BatchId.{f.name} must be an int in [{lo}, {hi}], got {value!r}")


@dataclass(frozen=True)
class Release(Message):
    """Client -> daemon: the client no longer reads slot ``slot`` (batch ``seq``); returns one credit."""

    TAG: ClassVar[str] = "release"
    SENDER: ClassVar[str] = "client"
    slot: int = field(metadata=_COUNT)
    seq: int = field(metadata=_COUNT)


@dataclass(frozen=True)
class EpochEnd(Message):
    """Daemon -> client: every batch of training epoch ``epoch`` has been sent (after its last BatchReady)."""

    TAG: ClassVar[str] = "epoch_end"
    SENDER: ClassVar[str] = "daemon"
    epoch: int = field(metadata=_U32)
    batches: int = field(metadata=_COUNT)
    """BatchReady messages sent in this stream."""
    passes: int = field(metadata=_COUNT)
    """Passes over the training nodes the epoch made."""


@dataclass(frozen=True)
class EvalEnd(Message):
    """Daemon -> client: every batch of the ``split`` evaluation stream has been sent."""

    TAG: ClassVar[str] = "eval_end"
    SENDER: ClassVar[str] = "daemon"
    split: str = field(metadata={"choices": SPLITS})
    batches: int = field(metadata=_COUNT)


@dataclass(frozen=True)
class StatsRequest(Message):
    """Client -> daemon: ask for a ``Stats`` snapshot (allowed at any time after the handshake)."""

    TAG: ClassVar[str] = "stats_request"
    SENDER: ClassVar[str] = "client"


@dataclass(frozen=True)
class Stats(Message):
    """Daemon -> client: named counters and gauges (base units; names as in the metrics, no prefix)."""

    TAG: ClassVar[str] = "stats"
    SENDER: ClassVar[str] = "daemon"
    values: dict[str, float]


@dataclass(frozen=True)
class Error(Message):
    """Either direction: ``code`` (an ``ErrorCode`` value; unknown codes are fatal) and a human message."""

    TAG: ClassVar[str] = "error"
    SENDER: ClassVar[str] = "either"
    code: str
    message: str

    @property
    def fatal(self) -> bool:
        """True unless ``code`` is ``bad_request``: the sender closes the connection after a fatal error."""
        return self.code != ErrorCode.BAD_REQUEST


@dataclass(frozen=True)
class Bye(Message):
    """Either direction: orderly close; the sender closes the connection next. ``reason`` defaults to ""."""

    TAG: ClassVar[str] = "bye"
    SENDER: ClassVar[str] = "either"
    reason: str = ""


@dataclass(frozen=True)
class Shutdown(Message):
    """Daemon -> client: the daemon is shutting down (``reason`` says why, for humans). No new batch
    follows; batches already announced stay readable and releasable until the client releases them or
    the daemon's drain timeout passes, then the daemon closes the connection. A compatible revision of
    version 1 (proto/PROTOCOL.md, "Versioning"): an older client fails on the unknown tag and
    disconnects, which is what it should do anyway."""

    TAG: ClassVar[str] = "shutdown"
    SENDER: ClassVar[str] = "daemon"
    reason: str


@dataclass(frozen=True)
class Queued(Message):
    """Daemon -> client, only to a client whose Hello set ``queue``: its StartEpoch waits for the training
    pipeline, ``position`` (1 = next) in the queue, while ``holder`` (for humans: "session 3", "job 'x'")
    trains. Sent when the wait starts, when the position changes, and every few seconds meanwhile (a
    client's read timeout sees traffic). The stream then goes on as usual: batches, then ``EpochEnd``.
    A compatible revision of version 1: no older client asks to queue, so none receives the tag."""

    TAG: ClassVar[str] = "queued"
    SENDER: ClassVar[str] = "daemon"
    position: int = field(metadata=_POSITIVE)
    holder: str


MESSAGE_TYPES: Mapping[str, type[Message]] = types.MappingProxyType({
    cls.TAG: cls for cls in (Hello, Welcome, Credit, StartEpoch, EvalRequest, BatchReady, Release, EpochEnd,
                             EvalEnd, StatsRequest, Stats, Error, Bye, Shutdown, Queued)
})
"""Tag -> message class, every message of this protocol version."""


def message_to_map(msg: Message) -> dict[str, Any]:
    """The wire map of ``msg``: ``{"t": TAG, field: value, ...}``, nested records as maps."""
    out: dict[str, Any] = {"t": msg.TAG}
    out.update(_record_to_map(msg))
    return out


def _record_to_map(record: Record) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        out[f.name] = _record_to_map(value) if isinstance(value, Record) else value
    return out


def message_from_map(frame: Any) -> Message:
    """The message a decoded frame describes; raises ``ProtocolError`` if it is not a valid message.

    ``frame`` must be a map with a string tag ``"t"`` naming a message of this protocol version
    (``unknown_message`` otherwise), every field of the message (fields with a default may be left out)
    with the right type and range (``bad_message`` otherwise). Keys this version does not know are
    ignored, so a minor revision may add fields.
    """
    if not isinstance(frame, dict):
        raise _fail("frame", f"expected a map, got {type(frame).__name__} {_short(frame)}")
    if "t" not in frame:
        raise _fail("frame", "has no tag (key 't')")
    tag = frame["t"]
    if not isinstance(tag, str):
        raise _fail("frame", f"tag must be a string, got {type(tag).__name__} {_short(tag)}")
    cls = MESSAGE_TYPES.get(tag)
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_MESSAGE.value, f"unknown message tag {_short(tag)}")
    return _record_from_map(cls, frame, cls.__name__)


_R = typing.TypeVar("_R", bound=Record)


def _record_from_map(cls: type[_R], frame: dict[Any, Any], where: str) -> _R:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in frame:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _fail(f"{where}.{f.name}", "missing")
            continue
        value = frame[f.name]
        if isinstance(f.type, type) and issubclass(f.type, Record):
            if not isinstance(value, dict):
                raise _fail(f"{where}.{f.name}", f"expected a map, got {type(value).__name__} {_short(value)}")
            value = _record_from_map(f.type, value, f"{where}.{f.name}")
        kwargs[f.name] = value
    return cls(**kwargs)
