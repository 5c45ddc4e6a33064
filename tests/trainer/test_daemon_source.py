"""``trainer.daemon_source`` without a daemon: what it says about the slots (the stream itself runs against a real
daemon in tests/end_to_end)."""

from proto.messages import SlotLayout
from trainer.daemon_source import describe_slots


def test_slots_under_a_mib_read_in_kib_not_as_0_mib():
    kib = 1024
    assert describe_slots(SlotLayout(count=4, slot_bytes=788 * kib, header_bytes=4 * kib,
                                      segment_bytes=4 * 788 * kib)) == "4 slots of 788 KiB"
    assert describe_slots(SlotLayout(count=1, slot_bytes=64 << 20, header_bytes=4 * kib,
                                      segment_bytes=64 << 20)) == "1 slot of 64 MiB"
