"""bench/accuracy_bench.py: the daemon configs at a feature ratio and the names of its runs."""

import tomllib
from pathlib import Path

import pytest

from bench.accuracy_bench import (
    BYTES_PER_FEATURE,
    DAEMON_EXTRA,
    daemon_config,
    daemon_tables,
    megabatch_fraction,
    parse_args,
    run_stem,
    toml_text,
)


def test_megabatch_fraction_is_one_over_the_ratio():
    assert megabatch_fraction(4) == 0.25
    assert megabatch_fraction(1) == 1.0
    for bad in (0.5, 0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="feature ratio"):
            megabatch_fraction(bad)


def test_the_ratio_sets_the_fraction_only_where_the_mode_sets_none():
    base = {"dataset": {"path": "/d"}}
    assert daemon_tables(base, {}, 4)["hierarchy"] == {"megabatch_fraction": 0.25}
    own = {"hierarchy": {"megabatch_fraction": 0.5}}
    assert daemon_tables(base, own, 4)["hierarchy"] == {"megabatch_fraction": 0.5}
    # a full-graph mode has no mega-batch to size
    assert "hierarchy" not in daemon_tables(base, {"loader": {"mode": "staged"}}, 4)
    assert "hierarchy" not in daemon_tables(base, {}, None)
    both = daemon_tables(base, {"hierarchy": {"schedule": "random"}, "memory": {"budget": "3G"}}, 2)
    assert both["hierarchy"] == {"schedule": "random", "megabatch_fraction": 0.5} and both["memory"]["budget"] == "3G"
    assert base == {"dataset": {"path": "/d"}}


def test_toml_text_round_trips():
    tables = {"dataset": {"path": 'a "b"\\c'}, "sampler": {"fanouts": [10, 5], "seed": 3},
              "hierarchy": {"megabatch_fraction": 1 / 3, "static_cache": False}}
    assert tomllib.loads(toml_text(tables)) == tables
    with pytest.raises(TypeError, match=r"\[x\] y"):
        toml_text({"x": {"y": [1.5]}})  # type: ignore[dict-item]


@pytest.mark.parametrize("mode", sorted(DAEMON_EXTRA))
def test_every_daemon_mode_config_parses(mode):
    args = parse_args(["--modes", "NS," + mode])
    config = tomllib.loads(daemon_config(mode, Path("/d"), Path("/s.sock"), 1, args))
    fraction = config.get("hierarchy", {}).get("megabatch_fraction")
    if "loader" in DAEMON_EXTRA[mode]:
        assert fraction is None
    else:
        # float16 rows (HB16) take half the bytes: twice the partitions in a mega-batch at the same ratio in bytes
        want = 0.25 * BYTES_PER_FEATURE.get(mode, 1)
        assert fraction == DAEMON_EXTRA[mode].get("hierarchy", {}).get("megabatch_fraction", want)


def test_run_names_tell_partitions_and_ratio_apart():
    args = parse_args(["--partitions", "256", "--feature-ratio", "8"])
    assert run_stem("cora", "HB", 0, args) == "cora-p256-HB-r8-seed0"
    assert run_stem("cora", "HB25", 0, args) == "cora-p256-HB25-seed0"  # its own fraction
    assert run_stem("cora", "NS", 1, args) == "cora-p256-NS-seed1"
    assert run_stem("cora", "HB", 0, parse_args(["--feature-ratio", "auto"])) == "cora-p32-HB-seed0"


def test_exact_semantics_modes_need_ns_unless_trained(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--modes", "HB,STAGED"])
    assert "add NS" in capsys.readouterr().err
    assert parse_args(["--modes", "HB,STAGED", "--train-exact"]).train_exact
    with pytest.raises(SystemExit):
        parse_args(["--feature-ratio", "0.5"])


def test_float16_modes_run_on_their_own_prepared_copy():
    args = parse_args(["--modes", "NS,NS16,HB,HB16"])
    stems = {run_stem("g", mode, 0, args) for mode in ("NS", "NS16", "HB", "HB16")}
    assert len(stems) == 4  # --reuse never takes a float32 run for a float16 one
    args = parse_args(["--modes", "HB16", "--feature-ratio", "1.5"])
    config = tomllib.loads(daemon_config("HB16", Path("/d"), Path("/s.sock"), 1, args))
    assert config["hierarchy"]["megabatch_fraction"] == 1.0  # half of 1.5 in bytes: the whole graph, not more
    # 8-bit codes: a quarter of the bytes, four times the partitions at the same ratio in bytes
    args = parse_args(["--modes", "NS8,HB8", "--feature-ratio", "8"])
    assert len({run_stem("g", mode, 0, args) for mode in ("NS", "NS16", "NS8", "HB", "HB16", "HB8")}) == 6
    config = tomllib.loads(daemon_config("HB8", Path("/d"), Path("/s.sock"), 1, args))
    assert config["hierarchy"]["megabatch_fraction"] == 0.5
