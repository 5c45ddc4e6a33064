"""The part of the budget every mode shares, and the one line every "does not fit" is."""

from loader.daemon.budget_plan import budget_too_small, fixed_part
from loader.daemon.resident import NODE_ARRAY_BYTES
from loader.daemon.slot_sizing import SessionSizing
from proto.errors import UserError


def test_the_fixed_part_is_node_arrays_and_slots():
    sessions = SessionSizing(clients=2, slots=3, slot_bytes=1 << 20)
    fixed = fixed_part(1000, sessions)
    assert fixed.node_arrays == 1000 * NODE_ARRAY_BYTES
    assert fixed.total == fixed.node_arrays + (6 << 20)
    assert [size for _, size in fixed.parts()] == [fixed.node_arrays, 6 << 20]
    assert fixed.parts()[1][0] == f"slots ({sessions.describe()})"


def test_budget_too_small_names_every_part_their_sum_and_the_remedy_in_one_line():
    err = budget_too_small(64 << 20, "exact", [("node arrays and slots", 40 << 20), ("read buffers", 30 << 20)],
                           "lower [fullgraph] superbatch")
    assert isinstance(err, UserError)
    assert str(err) == ("memory budget 64 MiB is too small for mode exact: node arrays and slots 40 MiB + read "
                        "buffers 30 MiB = 70 MiB; raise [memory] budget or lower [fullgraph] superbatch")
