"""What a link-prediction run is configured with and records: ``LinkConfig`` in, ``LinkEpochRecord``s and a
``LinkResult`` out, in the style of the node task's ``trainer.records`` (the same JSON keys where they mean
the same thing: ``best_epoch``, ``best_val_score``, ``test_score_at_best``, ``epochs``, ``stopped_*``)."""

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from proto.errors import UserError
from trainer.link.options import DECODERS, LINK_ASSIGNMENTS, LINK_ORDERS
from trainer.link.ranking import LINK_METRIC_CHOICES, LINK_METRICS
from trainer.provenance import CodeSpan
from trainer.records import TrainConfig

__all__ = ["LinkConfig", "LinkEpochRecord", "LinkResult", "format_link_epoch", "short_name"]

_SHORT = {"roc_auc": "auc"}


def short_name(metric: str) -> str:
    """A metric's name in log lines: ``auc`` for roc_auc, the others as ``--metric`` names them."""
    return _SHORT.get(metric, metric)


@dataclass(frozen=True)
class LinkConfig:
    """A link-prediction run: ``train`` the options it shares with node runs (model, hidden, dropout, lr,
    weight_decay, epochs, eval_every, patience, seed, device, checkpoint, resume, heads, max_steps; its
    ``metric`` is not read), decoder ("dot", the default, or "mlp"), negatives (training negatives per
    positive, default 1), disjoint (drop a batch's positive edges from its message passing, default False),
    metric (a ``LINK_METRIC_CHOICES`` name; "auto", the default, is mrr) and the training order: link_order
    ("shuffled", the default, or the buffer orders "comet" and "beta"), buffer_partitions and
    logical_partitions as given (None: not given; the source checks them against the dataset),
    negative_weights (a buffer order's negatives weighted, ``loader.sampling.negative_weights``), ema (the
    decay of the moving average of the weights that evaluation uses; 0: the last weights) and assignment (how COMET
    gives its states their edges, ``--link-assignment``: "edge", the default, or "bucket"; None where no COMET plan
    is trained in this process). Through a daemon, link_order is the order it serves and, for a buffer order,
    negative_weights and assignment are None: its ``[link]`` config decides them, and the trainer is not told."""

    train: TrainConfig
    decoder: str = "dot"
    negatives: int = 1
    disjoint: bool = False
    metric: str = "auto"
    link_order: str = "shuffled"
    buffer_partitions: int | None = None
    logical_partitions: int | None = None
    negative_weights: bool | None = False
    ema: float = 0.0
    assignment: str | None = "edge"

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise UserError(f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.negatives < 1:
            raise UserError(f"negatives must be positive, got {self.negatives}")
        if self.link_order not in LINK_ORDERS:
            raise UserError(f"link order must be one of {', '.join(LINK_ORDERS)}, got {self.link_order!r}")
        if self.assignment is not None and self.assignment not in LINK_ASSIGNMENTS:
            raise UserError(f"assignment must be one of {', '.join(LINK_ASSIGNMENTS)}, got {self.assignment!r}")
        if not 0.0 <= self.ema < 1.0:
            raise UserError(f"ema must be in [0, 1), got {self.ema}")
        if self.metric not in LINK_METRIC_CHOICES:
            raise UserError(f"a link-prediction metric must be one of {', '.join(LINK_METRIC_CHOICES)}, "
                            f"got {self.metric!r}")

    def to_json(self) -> dict[str, Any]:
        return {**self.train.to_json(), "task": "link", "decoder": self.decoder, "negatives": self.negatives,
                "disjoint": self.disjoint, "metric": self.metric, "link_order": self.link_order,
                "buffer_partitions": self.buffer_partitions, "logical_partitions": self.logical_partitions,
                "negative_weights": self.negative_weights, "ema": self.ema, "assignment": self.assignment}


def _json_float(value: float | None) -> float | None:
    """NaN (an undefined score) as None: JSON has no NaN and strict parsers reject Python's."""
    return None if value is None or math.isnan(value) else value


def _json_scores(scores: dict[str, float] | None) -> dict[str, float | None] | None:
    return None if scores is None else {name: _json_float(value) for name, value in scores.items()}


@dataclass
class LinkEpochRecord:
    """What one epoch did. loss: mean BCE over the epoch's supervision pairs; samples: positives trained
    on; val: every ``LINK_METRICS`` score of the validation split (None without evaluation); test: the
    test split's, evaluated only where val improved on the best so far (None elsewhere: the test score
    reported is the best val epoch's); val_score, test_score: by the run's metric; buffer_states,
    partition_loads: in a buffer order (``--link-order comet|beta``; None when shuffled), the epoch plan's
    states and the physical partitions it reads (``BufferPlan.io_partitions``: the first state whole, then
    each swap's). Timings as ``trainer.records.EpochRecord``'s."""

    epoch: int
    loss: float
    batches: int
    samples: int
    samples_per_s: float
    wait_s: float
    step_s: float
    data_wait: float
    train_s: float
    eval_s: float = 0.0
    val: dict[str, float] | None = None
    test: dict[str, float] | None = None
    val_score: float | None = None
    test_score: float | None = None
    buffer_states: int | None = None
    partition_loads: int | None = None

    def to_json(self) -> dict[str, Any]:
        values = asdict(self)
        values.update(val=_json_scores(self.val), test=_json_scores(self.test), val_score=_json_float(self.val_score),
                      test_score=_json_float(self.test_score))
        return values


@dataclass
class LinkResult:
    """Every epoch's record and the best validation epoch by ``metric`` (a ``LINK_METRICS`` name; None only
    before the run resolved it): best_val_score and test_score_at_best its scores by the metric, best_val
    and test_at_best every score there."""

    config: LinkConfig
    device: str
    source: str
    epochs: list[LinkEpochRecord] = field(default_factory=list)
    best_epoch: int | None = None
    best_val_score: float | None = None
    test_score_at_best: float | None = None
    best_val: dict[str, float] | None = None
    test_at_best: dict[str, float] | None = None
    metric: str | None = None
    metric_reason: str | None = None
    stopped_early: bool = False
    stopped_at_max_steps: bool = False
    stopped_on_request: bool = False
    resumed_from_epoch: int | None = None
    code: list[CodeSpan] = field(default_factory=list)
    """The code that trained each stretch of epochs (``trainer.provenance``): one span unless a resume changed it."""
    buffer: dict[str, object] | None = None
    """A buffer order's settings as resolved (``BufferSettings.to_json``); None when shuffled."""
    model: torch.nn.Module | None = field(default=None, repr=False, compare=False)
    """The trained model (on the training device): the moving average of the weights that evaluation ran
    (``LinkConfig.ema``), or the last epoch's weights; not part of ``to_json``."""

    def to_json(self) -> dict[str, Any]:
        return {"task": "link", "config": self.config.to_json(), "device": self.device, "source": self.source,
                "metric": self.metric, "metric_reason": self.metric_reason,
                "epochs": [record.to_json() for record in self.epochs], "best_epoch": self.best_epoch,
                "best_val_score": _json_float(self.best_val_score),
                "test_score_at_best": _json_float(self.test_score_at_best),
                "best_val": _json_scores(self.best_val), "test_at_best": _json_scores(self.test_at_best),
                "stopped_early": self.stopped_early, "stopped_at_max_steps": self.stopped_at_max_steps,
                "stopped_on_request": self.stopped_on_request, "resumed_from_epoch": self.resumed_from_epoch,
                "code": [span.to_json() for span in self.code], "buffer": self.buffer}

    def summary(self) -> str:
        """The final line: ``best val mrr 0.4123 at epoch 12: test mrr 0.4011 hits@1 0.2500 hits@10 0.8000
        hits@50 0.9500 auc 0.9120``."""
        stop = f" (stopped early after epoch {self.epochs[-1].epoch})" if self.stopped_early and self.epochs else ""
        if self.best_epoch is None or self.test_at_best is None or self.metric is None:
            if any(record.val is not None for record in self.epochs):
                return f"no evaluation gave a defined val {self.metric}{stop}"
            steps = f" (stopped at --max-steps {self.config.train.max_steps})" if self.stopped_at_max_steps else ""
            return f"no evaluation ran{steps}"
        test = " ".join(f"{short_name(name)} {self.test_at_best[name]:.4f}" for name in LINK_METRICS)
        best = f"best val {short_name(self.metric)} {self.best_val_score:.4f} at epoch {self.best_epoch}"
        return f"{best}: test {test}{stop}"

    def finished_line(self) -> str:
        """The totals over the epochs this run trained (not those a resumed checkpoint holds)."""
        first = (self.resumed_from_epoch or 0) + 1
        epochs = [record for record in self.epochs if record.epoch >= first]
        samples = sum(record.samples for record in epochs)
        train_s = sum(record.train_s for record in epochs)
        rate = samples / train_s if train_s > 0 else 0.0
        return (f"training finished: {len(epochs)} epoch{'s' if len(epochs) != 1 else ''}, {samples:,} positives "
                f"in {train_s:.1f} s of training ({rate:,.0f} positives/s)")


def format_link_epoch(record: LinkEpochRecord, total: int, metric: str) -> str:
    """``epoch 3/20  loss 0.512  val mrr 0.412 auc 0.905  4486 positives/s  data-wait 1.2%``: val shows
    the run's ``metric`` first, then mrr and auc where the metric is neither."""
    if record.val is None:
        val = "-"
    else:
        shown = [metric, *(name for name in ("mrr", "roc_auc") if name != metric)]
        val = " ".join(f"{short_name(name)} {record.val[name]:.3f}" for name in shown)
    return (f"epoch {record.epoch}/{total}  loss {record.loss:.3f}  val {val}  {record.samples_per_s:.0f} positives/s  "
            f"data-wait {100 * record.data_wait:.1f}%")
