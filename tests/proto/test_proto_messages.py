"""proto.messages and proto.codec: every message round-trips; every malformed frame is a ProtocolError."""

import dataclasses
import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.codec import MAX_CONTAINER_LEN, MAX_FRAME_BYTES, FrameDecoder, encode, message_from_map
from proto.errors import ProtocolError
from proto.messages import (
    LINK_ORDERS,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    BatchReady,
    Bye,
    Credit,
    DatasetInfo,
    EpochEnd,
    Error,
    ErrorCode,
    EvalEnd,
    EvalRequest,
    Hello,
    Message,
    Queued,
    Release,
    Shutdown,
    SlotLayout,
    StartEpoch,
    Stats,
    StatsRequest,
    Welcome,
    message_to_map,
)

I64 = st.integers(-(2**63), 2**63 - 1)
COUNT = st.integers(0, 2**63 - 1)
U32 = st.integers(0, 2**32 - 1)
TEXT = st.text(max_size=30)
FANOUT = st.integers(-1, 2**31 - 1)


@st.composite
def dataset_infos(draw: st.DrawFn) -> DatasetInfo:
    hops = draw(st.integers(0, 4))
    return DatasetInfo(
        name=draw(TEXT), num_nodes=draw(COUNT), num_features=draw(COUNT),
        feature_dtype=draw(st.sampled_from(["float32", "float16"])), num_classes=draw(COUNT), num_hops=hops,
        fanouts=draw(st.lists(FANOUT, min_size=hops, max_size=hops)),
        eval_fanouts=draw(st.lists(FANOUT, min_size=hops, max_size=hops)),
        batch_size=draw(st.integers(1, 2**63 - 1)), train_nodes=draw(COUNT), val_nodes=draw(COUNT),
        test_nodes=draw(COUNT), mode=draw(TEXT), task=draw(st.sampled_from(["node", "link"])),
        link_negatives=draw(COUNT), link_disjoint=draw(st.booleans()), link_eval_negatives=draw(COUNT),
        link_positives=draw(st.lists(COUNT, max_size=3)), link_order=draw(st.sampled_from(LINK_ORDERS)))


@st.composite
def slot_layouts(draw: st.DrawFn) -> SlotLayout:
    count = draw(st.integers(1, 1024))
    header = draw(st.integers(1, 2**20))
    slot = header + draw(st.integers(1, 2**30))
    return SlotLayout(count, slot, header, count * slot + draw(st.integers(0, 2**20)))


STRATEGIES: dict[type[Message], st.SearchStrategy[Message]] = {
    Hello: st.builds(Hello, I64, TEXT, COUNT, COUNT, TEXT, COUNT, st.integers(1, 2**63 - 1), st.integers(1, 2**63 - 1),
                     st.booleans()),
    Welcome: st.builds(Welcome, I64, TEXT, COUNT, dataset_infos(), slot_layouts(), COUNT, TEXT),
    Credit: st.builds(Credit, COUNT),
    StartEpoch: st.builds(StartEpoch, U32),
    EvalRequest: st.builds(EvalRequest, st.sampled_from(["val", "test"])),
    BatchReady: st.builds(BatchReady, COUNT, COUNT, st.sampled_from(["train", "val", "test"]), U32, U32, U32,
                          st.integers(-1, 2**31 - 1), COUNT),
    Release: st.builds(Release, COUNT, COUNT),
    EpochEnd: st.builds(EpochEnd, U32, COUNT, COUNT),
    EvalEnd: st.builds(EvalEnd, st.sampled_from(["val", "test"]), COUNT),
    StatsRequest: st.just(StatsRequest()),
    Stats: st.builds(Stats, st.dictionaries(TEXT, st.floats(allow_nan=False) | I64, max_size=20)),
    Error: st.builds(Error, st.sampled_from([c.value for c in ErrorCode]) | TEXT, TEXT),
    Bye: st.builds(Bye, TEXT),
    Shutdown: st.builds(Shutdown, TEXT),
    Queued: st.builds(Queued, st.integers(1, 2**63 - 1), TEXT),
}
ANY_MESSAGE = st.one_of(*STRATEGIES.values())

INFO = DatasetInfo("demo", 1000, 64, "float32", 8, 2, [10, 5], [-1, -1], 256, 600, 200, 200, "megabatch")
LAYOUT = SlotLayout(count=4, slot_bytes=8192, header_bytes=4096, segment_bytes=4 * 8192)
SAMPLES: list[Message] = [
    Hello(PROTOCOL_VERSION, "trainer rank 0", 1234), Welcome(PROTOCOL_VERSION, "0.1.0", 7, INFO, LAYOUT),
    Credit(4), StartEpoch(3), EvalRequest("val"), BatchReady(2, 17, "train", 3, 0, 5, 40), Release(2, 17),
    EpochEnd(3, 40, 1), EvalEnd("test", 3), StatsRequest(), Stats({"batches_total": 17.0, "queue_depth": 2}),
    Error("bad_request", "a stream is active"), Bye("done"), Bye(), Shutdown("SIGTERM"),
    Hello(PROTOCOL_VERSION, "trainer rank 1", 1235, feature_cache_bytes=1 << 30),
    Welcome(PROTOCOL_VERSION, "0.1.0", 8, INFO, LAYOUT, feature_cache_rows=1000),
    Hello(PROTOCOL_VERSION, "rank 1", 1236, job="host:29500", rank=1, world_size=4, local_world_size=2, queue=True),
    Welcome(PROTOCOL_VERSION, "0.1.0", 9, INFO, LAYOUT, job="host:29500"), Queued(2, "job 'host:29500'"),
    BatchReady(0, 0, "train", 1, 0, 3, 9, global_seeds=2048),
]


def frame(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def decode_one(data: bytes) -> Message:
    (msg,) = FrameDecoder().feed(data)
    return msg


def test_every_message_has_a_strategy_and_a_sample():
    assert set(STRATEGIES) == set(MESSAGE_TYPES.values())
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES.values())
    for tag, cls in MESSAGE_TYPES.items():
        assert tag == cls.TAG and cls.SENDER in ("client", "daemon", "either")


@settings(max_examples=300, deadline=None)
@given(ANY_MESSAGE)
def test_every_message_round_trips(msg):
    data = encode(msg)
    assert decode_one(data) == msg
    assert message_from_map(msgpack.unpackb(data)) == msg
    assert msgpack.unpackb(data)["t"] == msg.TAG


@settings(max_examples=100, deadline=None)
@given(st.lists(ANY_MESSAGE, max_size=12), st.data())
def test_a_stream_split_anywhere_decodes_in_order(msgs, data):
    stream = b"".join(encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    got: list[Message] = []
    for begin, end in zip([0, *cuts], [*cuts, len(stream)]):
        got.extend(decoder.feed(stream[begin:end]))
    assert got == msgs
    assert decoder.pending_bytes == 0


def test_feeding_byte_by_byte():
    stream = b"".join(encode(m) for m in SAMPLES)
    decoder = FrameDecoder()
    got: list[Message] = []
    for i in range(len(stream)):
        got.extend(decoder.feed(stream[i:i + 1]))
    assert got == SAMPLES


def test_many_frames_in_one_chunk_larger_than_the_frame_limit():
    msgs = [Release(i % 64, i) for i in range(20000)]
    stream = b"".join(encode(m) for m in msgs)
    assert len(stream) > 2 * MAX_FRAME_BYTES
    assert FrameDecoder().feed(stream) == msgs


def test_values_are_normalized_and_defaults_apply():
    assert Stats({"a": 3}).values == {"a": 3.0} and isinstance(Stats({"a": 3}).values["a"], float)
    assert decode_one(frame({"t": "bye"})) == Bye("")
    assert Error(ErrorCode.BUSY, "x") == Error("busy", "x")
    assert Error("bad_request", "").fatal is False and Error("busy", "").fatal is True
    assert Error("some_future_code", "").fatal is True


def test_unknown_fields_are_ignored():
    base = message_to_map(SAMPLES[1])
    base["future_field"] = [1, {"x": 2}]
    base["dataset"] = {**base["dataset"], "future_nested": "y"}
    assert decode_one(frame(base)) == SAMPLES[1]


def test_feature_cache_fields_are_optional_both_ways():
    # an old client's Hello and an old daemon's Welcome lack them: the cache is off
    old_hello = {"t": "hello", "protocol_version": PROTOCOL_VERSION, "client": "old trainer", "pid": 5}
    assert decode_one(frame(old_hello)) == Hello(PROTOCOL_VERSION, "old trainer", 5)
    assert decode_one(frame(old_hello)).feature_cache_bytes == 0
    old_welcome = message_to_map(SAMPLES[1])
    del old_welcome["feature_cache_rows"]
    assert decode_one(frame(old_welcome)).feature_cache_rows == 0
    assert decode_one(encode(Hello(PROTOCOL_VERSION, "t", 5, 4096))).feature_cache_bytes == 4096
    with pytest.raises(ProtocolError, match="Hello.feature_cache_bytes: -1 is outside"):
        decode_one(frame({**old_hello, "feature_cache_bytes": -1}))
    with pytest.raises(ProtocolError, match="Welcome.feature_cache_rows"):
        decode_one(frame({**old_welcome, "feature_cache_rows": "many"}))


def test_link_fields_are_optional_both_ways():
    # an old client says nothing of its task (node classification), an old daemon nothing of its dataset's
    old_hello = {"t": "hello", "protocol_version": PROTOCOL_VERSION, "client": "old trainer", "pid": 5}
    assert decode_one(frame(old_hello)).task == "node"
    assert decode_one(frame({**old_hello, "task": "link"})).task == "link"
    old_welcome = message_to_map(SAMPLES[1])
    for name in ("task", "link_negatives", "link_disjoint", "link_eval_negatives", "link_positives", "link_order"):
        old_welcome["dataset"].pop(name, None)
    info = decode_one(frame(old_welcome)).dataset
    assert (info.task, info.link_negatives, info.link_positives, info.link_order) == ("node", 0, [], "shuffled")
    with pytest.raises(ProtocolError, match="DatasetInfo.link_order: 'marius' is not one of shuffled, comet, beta"):
        decode_one(frame(_nested("dataset", link_order="marius")))
    with pytest.raises(ProtocolError, match="Hello.task: 'graph' is not one of node, link"):
        decode_one(frame({**old_hello, "task": "graph"}))
    with pytest.raises(ProtocolError, match=r"DatasetInfo.link_positives\[1\]: -2 is outside"):
        decode_one(frame(_nested("dataset", link_positives=[1, -2, 3])))


def _replace(msg: Message, **changes: object) -> dict:
    out = message_to_map(msg)
    out.update(changes)
    return out


def _nested(field: str, **changes: object) -> dict:
    out = message_to_map(SAMPLES[1])
    out[field] = {**out[field], **changes}
    return out


MALFORMED = {
    "not a map": (frame([1, 2]), "bad_message", "expected a map"),
    "a scalar": (frame(5), "bad_message", "expected a map"),
    "no tag": (frame({"count": 1}), "bad_message", "no tag"),
    "tag not a string": (frame({"t": 7}), "bad_message", "tag must be a string"),
    "unknown tag": (frame({"t": "launch_missiles"}), "unknown_message", "launch_missiles"),
    "bool for int": (frame(_replace(Credit(1), count=True)), "bad_message", "Credit.count: expected int"),
    "float for int": (frame(_replace(Credit(1), count=1.0)), "bad_message", "Credit.count: expected int"),
    "int for str": (frame(_replace(Bye(), reason=3)), "bad_message", "Bye.reason: expected str"),
    "bytes for str": (frame(_replace(Bye(), reason=b"x")), "bad_message", "Bye.reason: expected str"),
    "bool in list[int]": (frame(_nested("dataset", fanouts=[10, True])), "bad_message", r"fanouts\[1\]"),
    "str in list[int]": (frame(_nested("dataset", fanouts=["10", 5])), "bad_message", r"fanouts\[0\]"),
    "list is a map": (frame(_nested("dataset", fanouts={"a": 1})), "bad_message", "fanouts: expected list"),
    "str stat value": (frame(_replace(Stats({}), values={"a": "x"})), "bad_message", r"values\['a'\]"),
    "bool stat value": (frame(_replace(Stats({}), values={"a": True})), "bad_message", r"values\['a'\]"),
    "nested not a map": (frame(_replace(SAMPLES[1], dataset=5)), "bad_message", "Welcome.dataset: expected a map"),
    "nested missing": (frame({**message_to_map(SAMPLES[1]),
                              "slots": {"count": 1, "slot_bytes": 8192, "header_bytes": 4096}}),
                       "bad_message", "Welcome.slots.segment_bytes: missing"),
    "negative credit": (frame(_replace(Credit(1), count=-1)), "bad_message", "Credit.count: -1 is outside"),
    "negative slot": (frame(_replace(Release(0, 0), slot=-1)), "bad_message", "Release.slot"),
    "negative seq": (frame(_replace(SAMPLES[5], seq=-3)), "bad_message", "BatchReady.seq"),
    "negative batches": (frame(_replace(EpochEnd(0, 0, 0), batches=-1)), "bad_message", "EpochEnd.batches"),
    "num_batches < -1": (frame(_replace(SAMPLES[5], num_batches=-2)), "bad_message", "BatchReady.num_batches"),
    "epoch > u32": (frame(_replace(StartEpoch(0), epoch=2**32)), "bad_message", "StartEpoch.epoch"),
    "int > int64": (frame(_replace(Credit(0), count=2**64 - 1)), "bad_message", "does not fit in int64"),
    "zero batch size": (frame(_nested("dataset", batch_size=0)), "bad_message", "batch_size"),
    "fanout below -1": (frame(_nested("dataset", fanouts=[10, -2])), "bad_message", r"fanouts\[1\]"),
    "fanouts vs hops": (frame(_nested("dataset", fanouts=[10])), "bad_message", "expected num_hops = 2"),
    "feature dtype": (frame(_nested("dataset", feature_dtype="float64")), "bad_message", "feature_dtype"),
    "header fills slot": (frame(_nested("slots", header_bytes=8192)), "bad_message", "header_bytes"),
    "segment too small": (frame(_nested("slots", segment_bytes=8192)), "bad_message", "segment_bytes"),
    "eval split train": (frame(_replace(EvalRequest("val"), split="train")), "bad_message", "EvalRequest.split"),
    "end split dev": (frame(_replace(EvalEnd("val", 0), split="dev")), "bad_message", "EvalEnd.split"),
    "unknown kind": (frame(_replace(SAMPLES[5], kind="eval")), "bad_message", "BatchReady.kind"),
    "ext type": (frame(_replace(Bye(), reason=msgpack.ExtType(5, b"x"))), "bad_message", "Bye.reason"),
    "never-used byte": (b"\xc1", "bad_message", "invalid msgpack"),
    "int map key": (frame({"t": "bye", 1: 2}), "bad_message", "invalid msgpack"),
    "invalid utf-8": (b"\x81\xa1t\xa2\xff\xfe", "bad_message", "invalid msgpack"),
    "array too long": (b"\xdc" + (MAX_CONTAINER_LEN + 1).to_bytes(2, "big"), "frame_too_large", "max_array_len"),
    "map too long": (b"\xde" + (MAX_CONTAINER_LEN + 1).to_bytes(2, "big"), "frame_too_large", "max_map_len"),
    "oversize frame": (frame(_replace(Bye(), reason="x" * MAX_FRAME_BYTES)), "frame_too_large", "exceeds 65536"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_frames_are_protocol_errors(name):
    data, code, match = MALFORMED[name]
    with pytest.raises(ProtocolError, match=match) as info:
        FrameDecoder().feed(data)
    assert info.value.code == code


REQUIRED = [(cls, f.name) for cls in MESSAGE_TYPES.values() for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING]


@pytest.mark.parametrize(("cls", "name"), REQUIRED, ids=[f"{c.__name__}.{n}" for c, n in REQUIRED])
def test_every_missing_field_is_named(cls, name):
    sample = next(m for m in SAMPLES if type(m) is cls)
    data = message_to_map(sample)
    del data[name]
    with pytest.raises(ProtocolError, match=f"{cls.__name__}.{name}: missing") as info:
        decode_one(frame(data))
    assert info.value.code == "bad_message"


@pytest.mark.parametrize(("cls", "name"), REQUIRED, ids=[f"{c.__name__}.{n}" for c, n in REQUIRED])
def test_every_field_rejects_a_wrong_type(cls, name):
    sample = next(m for m in SAMPLES if type(m) is cls)
    with pytest.raises(ProtocolError, match=f"{cls.__name__}.{name}") as info:
        decode_one(frame(_replace(sample, **{name: b"\x00"})))  # bin is no field's type
    assert info.value.code == "bad_message"


def test_local_construction_validates_too():
    with pytest.raises(ValueError, match="Credit.count"):
        Credit(-1)
    with pytest.raises(ProtocolError, match="BatchReady.kind"):
        BatchReady(0, 0, "eval", 0, 0, 0, 1)


def test_encode_refuses_a_frame_the_peer_would_refuse():
    with pytest.raises(ProtocolError, match="encodes to") as info:
        encode(Error("internal", "x" * MAX_FRAME_BYTES))
    assert info.value.code == "frame_too_large"


@pytest.mark.parametrize("prefix", [b"\xdb\xff\xff\xff\xff", b"\x81\xa1t\xdb\x00\x10\x00\x00"],
                         ids=["declared-4GiB-str", "declared-1MiB-tag"])
def test_oversize_frame_is_rejected_before_it_is_buffered(prefix):
    # A peer that declares a huge string and then streams it: the decoder must give up once the frame
    # passes the limit, holding no more than the limit, instead of waiting for all of it.
    decoder = FrameDecoder()
    chunk = b"a" * 1024
    fed = 0
    with pytest.raises(ProtocolError) as info:
        decoder.feed(prefix)
        for _ in range(1024):
            decoder.feed(chunk)
            fed += len(chunk)
            assert decoder.pending_bytes <= MAX_FRAME_BYTES
    assert info.value.code == "frame_too_large"
    assert fed <= MAX_FRAME_BYTES


def test_nested_containers_cannot_blow_up_memory():
    bomb = b"\xdc" + MAX_CONTAINER_LEN.to_bytes(2, "big")  # arrays of the longest allowed length, nested
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as info:
            decoder = FrameDecoder()
            for _ in range(MAX_FRAME_BYTES // len(bomb) + 1):
                decoder.feed(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code in ("bad_message", "frame_too_large")
    assert peak < 32 * 1024 * 1024


def test_decoder_is_unusable_after_an_error():
    decoder = FrameDecoder()
    assert decoder.feed(encode(Credit(1))) == [Credit(1)]
    with pytest.raises(ProtocolError):
        decoder.feed(b"\xc1")
    with pytest.raises(ProtocolError, match="invalid msgpack"):
        decoder.feed(encode(Credit(1)))


def test_smaller_frame_limit():
    decoder = FrameDecoder(max_frame_bytes=32)
    assert decoder.feed(encode(Credit(1)) * 10) == [Credit(1)] * 10
    with pytest.raises(ProtocolError, match="exceeds 32 bytes"):
        decoder.feed(encode(Bye("x" * 40)))


def test_shutdown_is_a_daemon_message_with_a_required_reason():
    assert Shutdown.TAG == "shutdown" and Shutdown.SENDER == "daemon"
    assert decode_one(encode(Shutdown("SIGTERM received"))) == Shutdown("SIGTERM received")
    with pytest.raises(ProtocolError) as err:
        decode_one(frame({"t": "shutdown"}))
    assert err.value.code == "bad_message" and "Shutdown.reason: missing" in err.value.message
