"""The code a run trains with, recorded in its checkpoint and its JSON result.

A checkpoint resumes bit for bit only under the code that wrote it: the training step's semantics change between
commits without changing the model's shape (how dropout draws its mask, which Adam kernel rounds the update, the
order of a sum), so a run resumed after an upgrade silently becomes two runs. The checkpoint keeps the code of
every stretch of epochs (``CodeSpan``), a resume under other code says so in a warning, and the JSON result
carries the spans, so that a report can tell which epochs which code trained.

The code is the package version, the commit of the source checkout the package runs from (with "+dirty" where
tracked files differ from it; None for an installed package, whose version is then what names it) and torch's
version (its kernels are part of the step).
"""

import functools
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import proto

__all__ = ["SOURCE_ROOT", "CodeVersion", "CodeSpan", "source_commit", "running_code", "extend_spans",
           "spans_from_json", "resumed_code_warning", "resumed_spans"]

SOURCE_ROOT = Path(__file__).resolve().parent.parent
"""The directory holding the ``trainer`` package: a source checkout's root, or site-packages."""


@dataclass(frozen=True)
class CodeVersion:
    megabatch: str
    commit: str | None
    torch: str

    def describe(self) -> str:
        commit = "" if self.commit is None else f" at commit {self.commit}"
        return f"megabatch {self.megabatch}{commit} with torch {self.torch}"


@dataclass(frozen=True)
class CodeSpan:
    """Epochs from ``first_epoch`` on (to the next span's, or the last) were trained by ``code``."""

    first_epoch: int
    code: CodeVersion

    def to_json(self) -> dict[str, Any]:
        return {"first_epoch": self.first_epoch, **asdict(self.code)}


def source_commit(root: Path = SOURCE_ROOT) -> str | None:
    """The short commit of the git checkout whose top level is ``root`` ("+dirty" where tracked files differ);
    None when ``root`` is not one (an installed package, or a directory inside some other repository), or git is
    missing."""
    root = root.resolve()

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root:
        return None
    head, dirty = git("rev-parse", "--short=12", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    if head is None or dirty is None:
        return None
    return head + ("+dirty" if dirty else "")


@functools.cache
def running_code() -> CodeVersion:
    """This process's code (git is asked once)."""
    import torch  # here: bench.harness reads ``source_commit`` without loading torch

    # str(): torch.__version__ is a str subclass, which a weights-only checkpoint load refuses
    return CodeVersion(megabatch=proto.__version__, commit=source_commit(), torch=str(torch.__version__))


def spans_from_json(values: list[dict[str, Any]]) -> list[CodeSpan]:
    """Undo ``CodeSpan.to_json`` over a list (a checkpoint's ``code``)."""
    return [CodeSpan(int(value["first_epoch"]), CodeVersion(str(value["megabatch"]), value["commit"],
                                                             str(value["torch"]))) for value in values]


def extend_spans(spans: list[CodeSpan], first_epoch: int, code: CodeVersion) -> list[CodeSpan]:
    """``spans`` with ``code`` training from ``first_epoch`` on: a new span only where the code changed."""
    if spans and spans[-1].code == code:
        return list(spans)
    return [*spans, CodeSpan(first_epoch, code)]


def resumed_code_warning(path: Path | str, spans: list[CodeSpan], last_epoch: int, code: CodeVersion) -> str | None:
    """What to warn of when a checkpoint after ``last_epoch`` trained by ``spans`` resumes under ``code``: None when
    it is the same code."""
    if not spans:
        return (f"{path} was written before checkpoints recorded their code: epochs 1-{last_epoch} may have been "
                f"trained by other code than this run's {code.describe()} (a resume is bitwise only under the same "
                f"code)")
    if spans[-1].code == code:
        return None
    return (f"{path}: epochs {spans[-1].first_epoch}-{last_epoch} were trained by {spans[-1].code.describe()}, the "
            f"rest of the run by {code.describe()}: other code may draw and round otherwise (a resume is bitwise "
            f"only under the same code; the result's \"code\" lists both)")


def resumed_spans(path: Path | str, spans: list[CodeSpan], last_epoch: int, code: CodeVersion,
                  warn: Callable[[str], None] | None) -> list[CodeSpan]:
    """A resume after ``last_epoch`` of a run ``spans`` trained, under ``code``: its spans from now on, the
    warning (``resumed_code_warning``) given to ``warn`` where there is one (None: a rank that does not log)."""
    warning = resumed_code_warning(path, spans, last_epoch, code)
    if warning is not None and warn is not None:
        warn(warning)
    return extend_spans(spans, last_epoch + 1, code)
