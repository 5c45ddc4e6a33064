"""proto.cli_types: the argparse converters both command lines use, on good and bad input."""

import argparse

import pytest

from proto.cli_types import non_negative_int, non_negative_seconds, port, positive_int, positive_seconds


@pytest.mark.parametrize("convert, text, value", [
    (positive_int, "1", 1), (positive_int, " 42 ", 42), (positive_int, "+7", 7),
    (non_negative_int, "0", 0), (non_negative_int, "12", 12),
    (port, "0", 0), (port, "9450", 9450), (port, "65535", 65535),
    (positive_seconds, "0.5", 0.5), (positive_seconds, "30", 30.0), (positive_seconds, "1e3", 1000.0),
    (non_negative_seconds, "0", 0.0), (non_negative_seconds, "2.5", 2.5),
])
def test_good_values_convert(convert, text, value):
    result = convert(text)
    assert result == value and type(result) is type(value)


@pytest.mark.parametrize("convert, text, message", [
    (positive_int, "0", "must be positive, got 0"),
    (positive_int, "-3", "must be positive, got -3"),
    (positive_int, "2.5", "expected an integer, got '2.5'"),
    (positive_int, "", "expected an integer, got ''"),
    (non_negative_int, "-1", "must not be negative, got -1"),
    (non_negative_int, "ten", "expected an integer, got 'ten'"),
    (port, "65536", "must be a port from 0 to 65535, got 65536"),
    (port, "-1", "must be a port from 0 to 65535, got -1"),
    (port, "http", "expected an integer, got 'http'"),
    (positive_seconds, "0", "must be a positive number of seconds, got 0"),
    (positive_seconds, "-1.5", "must be a positive number of seconds, got -1.5"),
    (positive_seconds, "inf", "must be a positive number of seconds, got inf"),
    (positive_seconds, "nan", "must be a positive number of seconds, got nan"),
    (positive_seconds, "soon", "expected a number, got 'soon'"),
    (non_negative_seconds, "-0.1", "must be a non-negative number of seconds, got -0.1"),
    (non_negative_seconds, "inf", "must be a non-negative number of seconds, got inf"),
    (non_negative_seconds, "1s", "expected a number, got '1s'"),
])
def test_bad_values_say_why(convert, text, message):
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        convert(text)
    assert str(caught.value) == message


def test_argparse_prints_the_reason_after_the_option(capsys):
    parser = argparse.ArgumentParser(prog="prog")
    parser.add_argument("--epochs", type=positive_int)
    parser.add_argument("--metrics-port", type=port)
    assert parser.parse_args(["--epochs", "3", "--metrics-port", "0"]) == argparse.Namespace(epochs=3,
                                                                                           metrics_port=0)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--metrics-port", "70000"])
    assert exit_info.value.code == 2
    assert "prog: error: argument --metrics-port: must be a port from 0 to 65535, got 70000" in capsys.readouterr().err
