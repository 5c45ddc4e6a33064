"""proto.sizes: byte counts in words and back."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto.sizes import counted, format_size, parse_size


@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"), (999, "999 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (1000 * 1024, "1000 KiB"), (1023 * 1024, "1023 KiB"), (4 << 20, "4 MiB"), (1000 << 20, "1000 MiB"),
    (3 << 40, "3 TiB"), (999.6 * 1024, "1000 KiB"), (1_098_974_756_864, "1 TiB"), (1023.6, "1 KiB"),
])
def test_format_size_writes_three_significant_digits_and_never_an_exponent(nbytes, text):
    assert format_size(nbytes) == text


@given(st.integers(0, 2**50))
def test_format_size_has_no_exponent_and_its_unit_is_the_largest_below_the_value(nbytes):
    number, unit = format_size(nbytes).split()
    assert "e" not in number
    assert float(number) < 1024 or unit == "TiB"


def test_parse_size_reads_what_the_configs_write():
    assert parse_size("448M") == 448 << 20 and parse_size("1G") == 1 << 30 and parse_size("4096") == 4096
    assert counted(1, "client") == "1 client" and counted(2, "mega-batch") == "2 mega-batches"
