"""bench/optimizer_bench.py: every kernel's row, checked equal before timing, ratios to the default."""

import pytest

from bench import optimizer_bench
from bench.optimizer_bench import main


def test_every_kernel_side_by_side(capsys):
    assert main(["--widths", "40,7", "--steps", "1", "--repeats", "1", "--warmup", "2"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0][3:6] == ["default", "foreach", "fused"]
    body = rows[1:]
    assert [(row[0], row[1]) for row in body] == [("| link", "40"), ("| link", "7"), ("| node", "40"), ("| node", "7")]
    assert all(cell.endswith("x") for row in body for cell in (row[6], row[7].rstrip(" |")))


def test_widths_must_be_positive_integers(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--widths", "0,3"])
    assert exit_.value.code == 2 and "positive integers" in capsys.readouterr().err


def test_a_kernel_that_updates_differently_is_refused_before_timing(monkeypatch, capsys):
    monkeypatch.setitem(optimizer_bench.KERNELS, "fused", {"fused": True, "betas": (0.5, 0.5)})
    with pytest.raises(SystemExit) as exit_:
        main(["--widths", "7", "--steps", "1", "--repeats", "1", "--tasks", "node"])
    assert "fused kernel's weights differ" in str(exit_.value.code)
