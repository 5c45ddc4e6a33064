"""Training checkpoints: everything a resumed run needs to continue bit for bit, written atomically.

A checkpoint is one ``torch.save`` file of plain containers and tensors (loaded back with
``weights_only=True``: no pickled code runs on load). It holds the model and optimizer states,
the last completed epoch, the early-stopping state, the per-epoch history, the torch, numpy and
Python RNG states, the training configuration, the model's shape ("signature") and the metric
the run is judged by (best epoch, early stopping). It is
written to a temporary file in the same directory, fsynced and renamed over the old one, so a
crash leaves either the previous checkpoint or the new one, never a torn file.
"""

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from proto.atomic import atomic_file, io_error
from proto.errors import UserError
from trainer.link.ranking import LINK_METRICS
from trainer.provenance import CodeSpan, spans_from_json
from trainer.scores import METRICS

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "LEGACY_METRIC", "TASK_METRICS", "Checkpoint",
           "save_checkpoint", "load_checkpoint", "check_compatible", "check_task", "check_metric", "capture_rng",
           "restore_rng"]

CHECKPOINT_FORMAT = "megabatch-trainer-checkpoint"
CHECKPOINT_VERSION = 1
# "metric" was added without a version bump: older files stay readable and mean LEGACY_METRIC
LEGACY_METRIC = "accuracy"
"""The metric of a checkpoint written before runs could be judged by another one."""

TASK_METRICS = {"node": METRICS, "link": LINK_METRICS}
"""The metrics a checkpoint of each task may be judged by. "task" was added without a version bump too: a
file without it was written by a node-classification run."""

_TASK_WORDS = {"node": "node classification", "link": "link prediction"}


@dataclass
class Checkpoint:
    """The state of a run after epoch ``epoch`` (1-based, the last completed one).

    ``signature`` is the model's shape (kind, in_dim, hidden, out_dim, num_layers, heads): a
    resume must match it exactly. ``config`` is the training configuration as plain values
    (informational: hyperparameters such as lr may change on resume). ``progress`` holds the
    early-stopping state (best_val: the best val score by ``metric``, best_epoch, best_test: the
    test accuracy there, best_val_acc, best_test_score, bad_evals, stopped_early, metric_reason)
    and ``history`` one dict per completed epoch. ``metric``: what "best" means (a
    ``trainer.scores.METRICS`` name; default ``LEGACY_METRIC``, what older checkpoints mean).
    ``world_size``: the ranks that trained the run (default 1); ``rank_rng``: with several, every
    rank's RNG states in rank order (``rng`` is rank 0's), else None. ``task``: "node" (default) or
    "link", the kind of run that wrote it (``check_task``). ``averaged_state``: the state of the moving average
    of the weights a link run evaluates (``torch.optim.swa_utils.AveragedModel``), None for a run without one.
    ``code``: the code that trained each stretch of epochs, in order (``trainer.provenance``);
    empty in a file written before checkpoints recorded it.
    """

    epoch: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
    signature: dict[str, Any]
    config: dict[str, Any]
    progress: dict[str, Any]
    history: list[dict[str, Any]]
    rng: dict[str, Any] = field(default_factory=dict)
    metric: str = LEGACY_METRIC
    world_size: int = 1
    rank_rng: list[dict[str, Any]] | None = None
    task: str = "node"
    averaged_state: dict[str, Any] | None = None
    code: list[CodeSpan] = field(default_factory=list)

    def payload(self) -> dict[str, Any]:
        return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "epoch": self.epoch,
                "model_state": self.model_state, "optimizer_state": self.optimizer_state,
                "signature": self.signature, "config": self.config, "progress": self.progress,
                "history": self.history, "rng": self.rng, "metric": self.metric, "world_size": self.world_size,
                "rank_rng": self.rank_rng, "task": self.task, "averaged_state": self.averaged_state,
                "code": [span.to_json() for span in self.code]}


def capture_rng() -> dict[str, Any]:
    """The torch (CPU and every CUDA device), numpy-global and Python RNG states, as plain values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Undo ``capture_rng``: every RNG continues where the captured run left off."""
    torch.set_rng_state(state["torch"])
    npstate = state["numpy"]
    np.random.set_state((npstate["kind"], npstate["keys"].numpy().astype(np.uint32), npstate["pos"],
                         npstate["has_gauss"], npstate["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path | str, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (temp file, fsync, rename, fsync of the directory)."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"checkpoint directory {parent} does not exist")
    try:
        with atomic_file(path) as out:
            torch.save(checkpoint.payload(), out)
    except OSError as err:
        raise io_error(err, f"writing checkpoint {path}") from err


_KEYS = ("epoch", "model_state", "optimizer_state", "signature", "config", "progress", "history", "rng")


def load_checkpoint(path: Path | str) -> Checkpoint:
    """Read a checkpoint; a missing, truncated, foreign or newer-version file is a UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no checkpoint to resume from (run without --resume to start afresh)")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises a zoo of types for a damaged zip or pickle
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{path}: corrupt or unreadable checkpoint ({first[:200]})") from None
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{path}: not a megabatch trainer checkpoint")
    if data.get("version") != CHECKPOINT_VERSION:
        raise UserError(f"{path}: checkpoint version {data.get('version')!r} is not supported "
                        f"(this trainer reads version {CHECKPOINT_VERSION})")
    missing = [key for key in _KEYS if key not in data]
    if missing:
        raise UserError(f"{path}: corrupt checkpoint (missing {', '.join(missing)})")
    task = data.get("task", "node")
    if task not in TASK_METRICS:
        raise UserError(f"{path}: checkpoint of an unknown task {task!r} (this trainer knows "
                        f"{', '.join(TASK_METRICS)})")
    metric = data.get("metric", LEGACY_METRIC)
    if metric not in TASK_METRICS[task]:
        raise UserError(f"{path}: checkpoint judges its run by an unknown metric {metric!r} "
                        f"(this trainer knows {', '.join(TASK_METRICS[task])} for {_TASK_WORDS[task]})")
    # world_size and rank_rng came with DDP, without a version bump: an older file was written by one rank
    world_size, rank_rng = data.get("world_size", 1), data.get("rank_rng")
    if not isinstance(world_size, int) or world_size < 1 or not (
            rank_rng is None or (isinstance(rank_rng, list) and len(rank_rng) == world_size)):
        raise UserError(f"{path}: corrupt checkpoint (world_size {world_size!r} and its per-rank RNG states)")
    # averaged_state came with weight averaging, without a version bump: an older file has none
    averaged = data.get("averaged_state")
    if averaged is not None and not isinstance(averaged, dict):
        raise UserError(f"{path}: corrupt checkpoint (averaged_state is a {type(averaged).__name__})")
    # code came with the resume warning, without a version bump: an older file has none
    try:
        code = spans_from_json(data.get("code", []))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserError(f"{path}: corrupt checkpoint (its record of the code that trained it)") from None
    return Checkpoint(**{key: data[key] for key in _KEYS}, metric=metric, world_size=world_size, rank_rng=rank_rng,
                      task=task, averaged_state=averaged, code=code)


def check_task(path: Path | str, checkpoint: Checkpoint, task: str) -> None:
    """Refuse to resume a checkpoint of the other task ("node" or "link"): its model, history and metric
    mean nothing to this run. Checked before the model's shape, whose differences would say less."""
    if checkpoint.task != task:
        raise UserError(f"{path}: a {_TASK_WORDS[checkpoint.task]} checkpoint cannot resume a {_TASK_WORDS[task]} "
                        f"run (--task {checkpoint.task} wrote it; start a new run or resume with --task "
                        f"{checkpoint.task})")


def check_compatible(path: Path | str, checkpoint: Checkpoint, signature: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint whose model shape differs from ``signature``; names each field."""
    diffs = [f"{key} {checkpoint.signature.get(key)!r} in the checkpoint, {value!r} now"
             for key, value in signature.items() if checkpoint.signature.get(key) != value]
    if diffs:
        raise UserError(f"{path}: checkpoint is incompatible with this run: {'; '.join(diffs)}")


def check_metric(path: Path | str, checkpoint: Checkpoint, requested: str) -> None:
    """Refuse to resume with ``--metric requested`` when the checkpoint's run is judged by another metric.

    ``auto`` always fits: it was resolved when the run began and the checkpoint keeps that choice.
    Switching metrics midway would compare the best epoch so far under one metric with later
    epochs under another.
    """
    if requested not in ("auto", checkpoint.metric):
        raise UserError(f"{path}: the checkpointed run is judged by {checkpoint.metric}, not {requested} "
                        f"(resume with --metric {checkpoint.metric} or auto, or start a new run)")
