"""Config validation: every bad value is a one-line UserError naming the table and key."""

import logging

import pytest

from loader.daemon.config import config_from_mapping, load_config
from loader.daemon.fullgraph.staged import STAGED_SUPERBATCH
from loader.daemon.modes import MODES, mode_class
from proto.errors import UserError
from tests.paths import REPO_ROOT


def base(**tables):
    data = {"dataset": {"path": "/data/x"}}
    data.update(tables)
    return data


def test_defaults_and_relative_paths(tmp_path):
    cfg = config_from_mapping(base(), base=tmp_path)
    assert cfg.sampler.fanouts == (10, 5) and cfg.sampler.eval_fanouts == (10, 5)
    assert cfg.memory.budget == 2 << 30 and cfg.hierarchy.passes == 1
    rel = config_from_mapping({"dataset": {"path": "d"}, "server": {"socket": "s.sock"}}, base=tmp_path)
    assert rel.dataset.path == tmp_path / "d" and rel.server.socket == tmp_path / "s.sock"


def test_mode_and_fullgraph_tables():
    cfg = config_from_mapping(base())
    assert cfg.loader.mode == "hierarchical" and cfg.fullgraph.neighbor_cache is None
    assert cfg.fullgraph.feature_cache is None
    cfg = config_from_mapping(base(loader={"mode": "exact"}, fullgraph={"superbatch": 8, "sample_group": 2,
                                                                         "neighbor_cache": "16M", "feature_cache": 0}))
    assert (cfg.loader.mode, cfg.fullgraph.superbatch, cfg.fullgraph.sample_group) == ("exact", 8, 2)
    assert cfg.fullgraph.neighbor_cache == 16 << 20 and cfg.fullgraph.feature_cache == 0


def test_the_old_exact_table_is_read_as_fullgraph_with_one_warning(caplog):
    tables = {"superbatch": 8, "neighbor_cache": "16M"}
    with caplog.at_level(logging.WARNING, logger="megabatch.config"):
        old = config_from_mapping(base(loader={"mode": "exact"}, exact=tables))
    assert old == config_from_mapping(base(loader={"mode": "exact"}, fullgraph=tables))
    warned = [r.getMessage() for r in caplog.records if r.name == "megabatch.config"]
    assert len(warned) == 1 and "[exact] is renamed [fullgraph]" in warned[0], warned
    # errors in the old table name the table as the file wrote it
    with pytest.raises(UserError, match=r"^\[exact\] superbatch: must be >= 1"):
        config_from_mapping(base(exact={"superbatch": 0}))


def test_both_the_old_and_the_new_table_is_one_line_error():
    with pytest.raises(UserError) as err:
        config_from_mapping(base(exact={"superbatch": 8}, fullgraph={"superbatch": 8}))
    assert str(err.value) == "[exact] and [fullgraph]: [exact] is renamed [fullgraph]; keep only [fullgraph]"


def test_mode_must_be_registered_and_the_error_lists_the_registry():
    with pytest.raises(UserError) as err:
        config_from_mapping(base(loader={"mode": "fast"}))
    assert str(err.value) == f"[loader] mode: expected one of {', '.join(MODES)}, got 'fast'"
    assert list(MODES)[:2] == ["hierarchical", "exact"] and "\n" not in str(err.value)


def test_superbatch_default_is_the_modes_own():
    # unset, the config leaves the choice to the mode: 64, and 512 in mode staged (whose pass it shares)
    staged = config_from_mapping(base(loader={"mode": "staged"}))
    assert staged.fullgraph.superbatch is None
    assert mode_class("staged").superbatch_for(staged) == STAGED_SUPERBATCH == 512
    exact = config_from_mapping(base(loader={"mode": "exact"}))
    assert mode_class("exact").superbatch_for(exact) == 64
    chosen = config_from_mapping(base(loader={"mode": "staged"}, fullgraph={"superbatch": 32}))
    assert mode_class("staged").superbatch_for(chosen) == 32


def test_fullgraph_sample_group_default_is_the_samplers():
    # one default for the group size, whether the sampler is built by the daemon or directly
    from loader.sampling.exact_sampling import DEFAULT_GROUP_SIZE

    assert config_from_mapping(base()).fullgraph.sample_group == DEFAULT_GROUP_SIZE


def test_auto_values():
    cfg = config_from_mapping(base(hierarchy={"passes": "auto", "megabatch_fraction": "auto"},
                                   publisher={"slot_bytes": "auto"}))
    assert cfg.hierarchy.passes is None and cfg.hierarchy.megabatch_fraction is None
    assert cfg.publisher.slot_bytes is None
    assert config_from_mapping(base(publisher={"slot_bytes": "64M"})).publisher.slot_bytes == 64 << 20
    # auto is the default of the fraction, the slots per client and the clients; explicit values stay
    default = config_from_mapping(base())
    assert default.hierarchy.megabatch_fraction is None and default.hierarchy.schedule == "balanced"
    assert default.publisher.slots is None and default.server.max_clients is None
    assert default.hierarchy.static_cache is None and default.hierarchy.formation == "groups"
    assert config_from_mapping(base(hierarchy={"formation": "comet"})).hierarchy.formation == "comet"
    assert config_from_mapping(base(hierarchy={"static_cache": "auto"})).hierarchy.static_cache is None
    assert config_from_mapping(base(hierarchy={"static_cache": False})).hierarchy.static_cache is False
    explicit = config_from_mapping(base(publisher={"slots": 3}, server={"max_clients": 2},
                                        hierarchy={"schedule": "random"}))
    assert (explicit.publisher.slots, explicit.server.max_clients, explicit.hierarchy.schedule) == (3, 2, "random")


@pytest.mark.parametrize("tables, needle", [
    ({"dataset": {}}, "[dataset] path: required"),
    ({"sampler": {"fanouts": [10, 0]}}, "[sampler] fanouts"),
    ({"sampler": {"fanouts": "10,5"}}, "[sampler] fanouts"),
    ({"sampler": {"eval_fanouts": [5]}}, "[sampler] eval_fanouts: needs one entry per hop"),
    ({"sampler": {"batch_size": 0}}, "[sampler] batch_size: must be >= 1"),
    ({"hierarchy": {"schedule": "sorted"}}, "[hierarchy] schedule: expected one of balanced, random"),
    ({"hierarchy": {"formation": "swap"}}, "[hierarchy] formation: expected one of groups, comet"),
    ({"publisher": {"slots": "many"}}, "[publisher] slots: expected an integer"),
    ({"server": {"max_clients": 0}}, "[server] max_clients: must be >= 1"),
    ({"sampler": {"batch_size": True}}, "[sampler] batch_size: expected an integer"),
    ({"sampler": {"batchsize": 3}}, "[sampler] batchsize: unknown option"),
    ({"hierarchy": {"megabatch_fraction": 1.5}}, "[hierarchy] megabatch_fraction"),
    ({"hierarchy": {"passes": 0}}, "[hierarchy] passes"),
    ({"hierarchy": {"static_cache": "yes"}}, "[hierarchy] static_cache: expected true, false or \"auto\""),
    ({"hierarchy": {"passes": 9}}, "exceeds max_passes"),
    ({"memory": {"budget": "lots"}}, "[memory] budget"),
    ({"io": {"read_block": 5000}}, "[io] read_block: must be a multiple of 4096"),
    ({"server": {"socket_mode": "rw"}}, "[server] socket_mode"),
    ({"metrics": {"port": 70000}}, "[metrics] port"),
    ({"log": {"level": "loud"}}, "[log] level"),
    ({"extra": {}}, "[extra]: unknown table"),
    ({"loader": {"mode": "fast"}}, "[loader] mode: expected one of hierarchical, exact"),
    ({"fullgraph": {"superbatch": 0}}, "[fullgraph] superbatch: must be >= 1"),
    ({"fullgraph": {"feature_cache": "big"}}, "[fullgraph] feature_cache"),
    ({"fullgraph": {"superbatches": 8}}, "[fullgraph] superbatches: unknown option"),
])
def test_bad_values_name_the_key(tables, needle):
    data = {"dataset": {"path": "/x"}}
    data.update(tables)
    with pytest.raises(UserError) as err:
        config_from_mapping(data)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_load_config_file_errors(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[dataset\npath=1")
    with pytest.raises(UserError, match="invalid TOML"):
        load_config(bad)
    ok = tmp_path / "ok.toml"
    ok.write_text('[dataset]\npath = "data"\n[sampler]\nfanouts = [15, 10, 5]\neval_fanouts = [-1, -1, -1]\n')
    cfg = load_config(ok)
    assert cfg.dataset.path == tmp_path / "data" and cfg.sampler.eval_fanouts == (-1, -1, -1)


def test_shipped_configs_parse():
    root = REPO_ROOT / "deploy" / "config"
    for name in ("demo.toml", "loader.toml"):
        assert load_config(root / name).sampler.batch_size > 0
