"""bench/input_layer_bench.py: its arguments are checked before any work (the timing itself is a benchmark)."""

import pytest

from bench import input_layer_bench


@pytest.mark.parametrize("argv", [["--models", "gat"], ["--models", ""], ["--repeats", "0"], ["--threads", "0"],
                                  ["--densities", "0"], ["--densities", "x"], ["--densities", "1.5"]])
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv):
    assert input_layer_bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("input_layer_bench: error:")
