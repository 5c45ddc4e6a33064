"""A run records the code that trained it, and a resume under other code says so."""

import json
import logging
import subprocess

import pytest
import torch

import loader
import proto
from proto.errors import UserError
from tests.trainer.test_trainer_loop import ToySource
from trainer import provenance
from trainer.checkpoint import load_checkpoint
from trainer.loop import TrainConfig, train
from trainer.provenance import CodeSpan, CodeVersion, extend_spans, resumed_code_warning, source_commit

OLD = CodeVersion("0.1.0", "aaaaaaaaaaaa", "2.13.0")
NEW = CodeVersion("0.1.0", "bbbbbbbbbbbb+dirty", "2.13.0")


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_source_commit_is_the_checkouts_own_commit_or_none(tmp_path):
    repo = tmp_path / "repo"
    (repo / "trainer").mkdir(parents=True)
    assert source_commit(repo) is None  # not a git checkout: an installed package
    git(repo, "init", "-q")
    (repo / "trainer" / "a.py").write_text("x = 1\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    assert source_commit(repo) == head
    (repo / "trainer" / "a.py").write_text("x = 2\n")
    assert source_commit(repo) == head + "+dirty"
    # a package directory inside some other repository is not that repository's code
    assert source_commit(repo / "trainer") is None


def test_spans_grow_only_where_the_code_changes():
    spans = [CodeSpan(1, OLD)]
    assert extend_spans(spans, 5, OLD) == spans
    assert extend_spans(spans, 5, NEW) == [CodeSpan(1, OLD), CodeSpan(5, NEW)]
    assert extend_spans([], 5, NEW) == [CodeSpan(5, NEW)]  # a checkpoint from before: epochs 1-4 unknown


def test_the_warning_names_both_codes_or_the_missing_record():
    assert resumed_code_warning("ck.pt", [CodeSpan(1, OLD)], 4, OLD) is None
    warning = resumed_code_warning("ck.pt", [CodeSpan(1, NEW), CodeSpan(3, OLD)], 4, NEW)
    assert warning is not None
    assert warning.startswith("ck.pt: epochs 3-4 were trained by megabatch 0.1.0 at commit aaaaaaaaaaaa with torch "
                              "2.13.0, the rest of the run by megabatch 0.1.0 at commit bbbbbbbbbbbb+dirty"), warning
    installed = CodeVersion("0.2.0", None, "2.14.0")
    assert "the rest of the run by megabatch 0.2.0 with torch 2.14.0" in str(
        resumed_code_warning("ck.pt", [CodeSpan(1, OLD)], 4, installed))
    legacy = resumed_code_warning("ck.pt", [], 4, OLD)
    assert legacy is not None and legacy.startswith("ck.pt was written before checkpoints recorded their code: "
                                                    "epochs 1-4 may have been trained by other code")


@pytest.fixture
def code_now(monkeypatch):
    """Set the code this process runs (``running_code``) to a given version."""
    def use(version: CodeVersion) -> None:
        for module in ("trainer.loop", "trainer.link.loop"):
            monkeypatch.setattr(f"{module}.running_code", lambda: version)
    return use


def test_a_resume_under_other_code_warns_and_records_both(tmp_path, code_now, caplog):
    ckpt = tmp_path / "ck.pt"
    cpu = {"hidden": 8, "seed": 1, "device": "cpu", "checkpoint": ckpt}
    code_now(OLD)
    first = train(ToySource(), TrainConfig(epochs=2, **cpu))
    assert first.code == [CodeSpan(1, OLD)] and load_checkpoint(ckpt).code == [CodeSpan(1, OLD)]
    with caplog.at_level(logging.WARNING, logger="megabatch.trainer"):
        again = train(ToySource(), TrainConfig(epochs=3, resume=True, **cpu))
    assert not [r for r in caplog.records if "trained by" in r.getMessage()]  # the same code: no warning
    assert again.code == [CodeSpan(1, OLD)]

    code_now(NEW)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="megabatch.trainer"):
        later = train(ToySource(), TrainConfig(epochs=4, resume=True, **cpu))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"{ckpt}: epochs 1-3 were trained by {OLD.describe()}, the rest of the run by "
                        f"{NEW.describe()}: other code may draw and round otherwise (a resume is bitwise only under "
                        f"the same code; the result's \"code\" lists both)"], warnings
    assert later.code == [CodeSpan(1, OLD), CodeSpan(4, NEW)] == load_checkpoint(ckpt).code
    assert json.loads(json.dumps(later.to_json()))["code"] == [
        {"first_epoch": 1, "megabatch": "0.1.0", "commit": "aaaaaaaaaaaa", "torch": "2.13.0"},
        {"first_epoch": 4, "megabatch": "0.1.0", "commit": "bbbbbbbbbbbb+dirty", "torch": "2.13.0"}]


def test_a_checkpoint_from_before_reads_as_unrecorded_and_a_broken_record_is_refused(tmp_path, code_now, caplog):
    ckpt = tmp_path / "ck.pt"
    cpu = {"hidden": 8, "seed": 1, "device": "cpu", "checkpoint": ckpt}
    code_now(OLD)
    train(ToySource(), TrainConfig(epochs=1, **cpu))
    payload = torch.load(ckpt, weights_only=True)
    del payload["code"]
    torch.save(payload, ckpt)
    assert load_checkpoint(ckpt).code == []
    with caplog.at_level(logging.WARNING, logger="megabatch.trainer"):
        resumed = train(ToySource(), TrainConfig(epochs=2, resume=True, **cpu))
    assert [r.getMessage() for r in caplog.records if "before checkpoints recorded" in r.getMessage()]
    assert resumed.code == [CodeSpan(2, OLD)]

    for broken in ([{"first_epoch": 1}], "abc", [3]):
        payload["code"] = broken
        torch.save(payload, ckpt)
        with pytest.raises(UserError, match=r"corrupt checkpoint \(its record of the code that trained it\)"):
            load_checkpoint(ckpt)


def test_the_running_code_is_this_tree():
    code = provenance.running_code()
    assert code.torch == torch.__version__ and code.megabatch == proto.__version__ == loader.__version__
    assert type(code.torch) is str  # torch.__version__ is a str subclass, which a weights-only load refuses
    if (provenance.SOURCE_ROOT / ".git").exists():  # a clone: its commit names the code
        assert code.commit is not None
        assert code.commit.split("+")[0] == git(provenance.SOURCE_ROOT, "rev-parse", "--short=12", "HEAD")
    else:  # a copied tree: the version alone
        assert code.commit is None
