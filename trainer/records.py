"""What a training run is configured with and what it records: ``TrainConfig`` in, ``EpochRecord``s and
a ``TrainResult`` out, and the ``StopControl`` a caller stops it through."""

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from proto.errors import UserError
from trainer.models import MODELS
from trainer.provenance import CodeSpan
from trainer.scores import METRIC_CHOICES, SHORT_NAMES

__all__ = ["TrainConfig", "EpochRecord", "StopControl", "TrainResult", "format_epoch"]


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters and run options of ``train``.

    model: "sage" (default), "gcn" or "gat". hidden: width of hidden layers (default 256).
    dropout: between layers (default 0.5). lr: Adam learning rate (default 0.003). weight_decay:
    (default 0). epochs: total epochs, counting those of a resumed run (default 10). eval_every:
    evaluate val and test every this many epochs and after the last (default 1). patience: stop
    after this many evaluations without a better val score (default None: never). seed: torch,
    numpy and Python RNGs (default 0). device: "auto" (CUDA when available, the default), "cpu" or
    "cuda". checkpoint: file written after every epoch (default None: none). resume: continue from
    ``checkpoint`` (default False). heads: attention heads of gat's hidden layers (default 4).
    max_steps: stop the whole run after this many optimizer steps, mid-epoch if need be, without
    evaluating the cut epoch (default None: no limit). Benchmarks use it to time a fixed amount of
    training; the cut epoch is recorded with the batches it trained. metric: what the run is
    judged by, the best epoch and early stopping included: "accuracy", "roc_auc", "macro_f1" or
    "auto" (the default: roc_auc for a binary task whose minority class is under 35% of the
    labelled training nodes, else accuracy; ``trainer.scores``). Accuracy is reported either way.
    micro_batches: train every batch as this many micro-batches (Betty's REG + METIS split; default
    None: whole). device_memory: bytes a training step may take on the device; each batch is split
    into the fewest micro-batches whose estimated peak fits (``trainer.micro_batches``; default None).
    """

    model: str = "sage"
    hidden: int = 256
    dropout: float = 0.5
    lr: float = 0.003
    weight_decay: float = 0.0
    epochs: int = 10
    eval_every: int = 1
    patience: int | None = None
    seed: int = 0
    device: str = "auto"
    checkpoint: Path | None = None
    resume: bool = False
    heads: int = 4
    max_steps: int | None = None
    metric: str = "auto"
    micro_batches: int | None = None
    device_memory: int | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise UserError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        for name in ("hidden", "epochs", "eval_every", "heads"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise UserError(f"max_steps must be positive, got {self.max_steps}")
        if self.patience is not None and self.patience <= 0:
            raise UserError(f"patience must be positive, got {self.patience}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UserError(f"lr must be positive, got {self.lr}")
        if self.weight_decay < 0:
            raise UserError(f"weight_decay must be non-negative, got {self.weight_decay}")
        if self.seed < 0:
            raise UserError(f"seed must be non-negative, got {self.seed}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.model == "gat" and self.hidden % self.heads:
            raise UserError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) for gat")
        if self.resume and self.checkpoint is None:
            raise UserError("resume needs a checkpoint path")
        if self.micro_batches is not None and self.micro_batches <= 0:
            raise UserError(f"micro_batches must be positive, got {self.micro_batches}")
        if self.device_memory is not None and self.device_memory <= 0:
            raise UserError(f"device_memory must be positive, got {self.device_memory}")
        if self.micro_batches is not None and self.device_memory is not None:
            raise UserError("give micro_batches (a fixed split) or device_memory (the split that fits), not both")
        if self.metric not in METRIC_CHOICES:
            raise UserError(f"metric must be one of {', '.join(METRIC_CHOICES)}, got {self.metric!r}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["checkpoint"] = None if self.checkpoint is None else str(self.checkpoint)
        return data


@dataclass
class EpochRecord:
    """What one epoch did. ``val_acc``/``test_acc`` are None for epochs without evaluation.

    val_score/test_score: the scores by the run's metric (equal to the accuracies when the metric
    is accuracy; NaN where the metric is undefined, e.g. AUC of a split holding one class; None
    without evaluation).

    wait_s: time blocked on the source (and on device copies); step_s: forward, backward and
    optimizer steps; data_wait = wait_s / (wait_s + step_s); samples: seed nodes trained on;
    train_s: the training part of the epoch, eval_s the evaluation part. h2d_bytes, h2d_s: the
    training batches' host-to-device copies, bytes and seconds on the copy stream (0 off CUDA).
    split_batches, micro_batches: batches trained as micro-batches and how many those were (0: none split);
    input_redundancy: their input rows summed over the micro-batches over the batches' rows (1.0: none
    loaded twice). peak_device_bytes: CUDA's ``max_memory_allocated`` over the epoch's training (0 off CUDA).
    """

    epoch: int
    loss: float
    train_acc: float
    val_acc: float | None
    test_acc: float | None
    batches: int
    samples: int
    samples_per_s: float
    wait_s: float
    step_s: float
    data_wait: float
    train_s: float
    eval_s: float
    val_score: float | None = None
    test_score: float | None = None
    h2d_bytes: int = 0
    h2d_s: float = 0.0
    split_batches: int = 0
    micro_batches: int = 0
    input_redundancy: float = 1.0
    peak_device_bytes: int = 0


def _json_float(value: float | None) -> float | None:
    """NaN (an undefined score) as None: JSON has no NaN and strict parsers reject Python's."""
    return None if value is None or math.isnan(value) else value


@dataclass
class StopControl:
    """Shared by ``train`` and its caller: a stop request in, what the checkpoint file holds out.

    ``requested`` (default False) may be set at any time, from a signal handler too; ``train`` stops at
    the next step boundary (or before the next epoch). ``checkpoint_epoch`` is the epoch of the
    checkpoint file as far as this run knows (the one it resumed from or last wrote; None: it wrote
    none and resumed from none). ``writing`` is the epoch being written while a checkpoint is saved
    (an interrupt then leaves the previous file or the new one, never a torn one).
    """

    requested: bool = False
    checkpoint_epoch: int | None = None
    writing: int | None = None


@dataclass
class TrainResult:
    """Every epoch's record and the best validation epoch (its test score is the headline number).

    metric: what the run is judged by (a ``trainer.scores.METRICS`` name; None only before the
    first epoch ends) and metric_reason why. The best epoch has the highest val score by it:
    best_val_score and test_score_at_best are its scores, best_val_acc and test_acc_at_best its
    accuracies (the same numbers when the metric is accuracy).
    """

    config: TrainConfig
    device: str
    source: str
    epochs: list[EpochRecord] = field(default_factory=list)
    best_epoch: int | None = None
    best_val_acc: float | None = None
    test_acc_at_best: float | None = None
    best_val_score: float | None = None
    test_score_at_best: float | None = None
    metric: str | None = None
    metric_reason: str | None = None
    stopped_early: bool = False
    stopped_at_max_steps: bool = False
    stopped_on_request: bool = False
    """A ``StopControl`` request stopped the run (its last epoch may have been cut and not recorded)."""
    resumed_from_epoch: int | None = None
    code: list[CodeSpan] = field(default_factory=list)
    """The code that trained each stretch of epochs (``trainer.provenance``): one span unless a resume changed it."""
    model: torch.nn.Module | None = field(default=None, repr=False, compare=False)
    """The trained model (last epoch's weights, on the training device); not part of ``to_json``."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-serializable values (``json.dumps`` works as is; an undefined score is null)."""
        epochs = []
        for record in self.epochs:
            values = asdict(record)
            values["val_score"], values["test_score"] = _json_float(record.val_score), _json_float(record.test_score)
            epochs.append(values)
        return {"config": self.config.to_json(), "device": self.device, "source": self.source,
                "metric": self.metric, "metric_reason": self.metric_reason,
                "epochs": epochs, "best_epoch": self.best_epoch,
                "best_val_acc": self.best_val_acc, "test_acc_at_best": self.test_acc_at_best,
                "best_val_score": _json_float(self.best_val_score),
                "test_score_at_best": _json_float(self.test_score_at_best),
                "stopped_early": self.stopped_early, "stopped_at_max_steps": self.stopped_at_max_steps,
                "stopped_on_request": self.stopped_on_request, "resumed_from_epoch": self.resumed_from_epoch,
                "code": [span.to_json() for span in self.code]}

    def summary(self) -> str:
        """The final line: best validation epoch and its test score (and accuracy, when that is not the score)."""
        stop = f" (stopped early after epoch {self.epochs[-1].epoch})" if self.stopped_early and self.epochs else ""
        if self.best_epoch is None:
            if any(r.val_score is not None for r in self.epochs):
                return f"no evaluation gave a defined val {self.metric}{stop}"
            steps = f" (stopped at --max-steps {self.config.max_steps})" if self.stopped_at_max_steps else ""
            return f"no evaluation ran{steps}"
        if self.metric in (None, "accuracy"):
            return (f"best val {self.best_val_acc:.4f} at epoch {self.best_epoch}: "
                    f"test {self.test_acc_at_best:.4f}{stop}")
        name = SHORT_NAMES[self.metric]
        return (f"best val {name} {self.best_val_score:.4f} at epoch {self.best_epoch}: test {name} "
                f"{self.test_score_at_best:.4f} (test acc {self.test_acc_at_best:.4f}){stop}")


def _split_column(accuracy: float | None, score: float | None, metric: str) -> str:
    if accuracy is None:
        return "-"
    if metric == "accuracy":
        return f"{accuracy:.3f}"
    shown = math.nan if score is None else score
    return f"{SHORT_NAMES[metric]} {shown:.3f} acc {accuracy:.3f}"


def format_epoch(record: EpochRecord, total: int, metric: str = "accuracy") -> str:
    """``epoch 3/10  loss 0.412  train 0.873  val 0.861  test 0.858  1234 samples/s  data-wait 4.1%``.

    With another ``metric`` than accuracy (default accuracy), val and test show both:
    ``val auc 0.912 acc 0.951  test auc 0.905 acc 0.948``. On CUDA the line ends with the copies' rate,
    ``H2D 11.2 GB/s`` (bytes copied over their time on the copy stream).
    """
    val = _split_column(record.val_acc, record.val_score, metric)
    test = _split_column(record.test_acc, record.test_score, metric)
    h2d = f"  H2D {record.h2d_bytes / record.h2d_s / 1e9:.1f} GB/s" if record.h2d_s > 0 else ""
    if record.split_batches:
        h2d += (f"  micro-batches {record.micro_batches / record.split_batches:.1f}/batch "
                f"(redundancy {record.input_redundancy:.2f})")
    return (f"epoch {record.epoch}/{total}  loss {record.loss:.3f}  train {record.train_acc:.3f}  val {val}  "
            f"test {test}  {record.samples_per_s:.0f} samples/s  data-wait {100 * record.data_wait:.1f}%{h2d}")
