"""The training loop: any ``BatchSource`` in, a trained model and per-epoch records out.

One batch is always a step ahead: while batch ``i`` trains, batch ``i+1`` has been taken from the
source and its copy to the device started (on a side CUDA stream). A batch's shared-memory slot
goes back to the producer as soon as nothing reads it: right after its device copy has landed on
CUDA, after its optimizer step on CPU (where the "copy" is the slot itself). So a CPU run holds
two batches at a time (the one training and the one fetched); a CUDA run releases each batch
before it blocks on the next.

Determinism: the source fixes the batches of each epoch; ``cfg.seed`` fixes the initial weights
and dropout; a checkpoint carries every RNG state, so a resumed run ends with the same model as
an uninterrupted one (bitwise on CPU).

Stopping (``StopControl``): a stop request (the CLI's SIGTERM handler) is honoured at the next step
boundary: the current step finishes, the rest of the epoch is dropped, nothing is evaluated or
checkpointed for it. Checkpoints hold completed epochs only, so the file keeps the last completed
epoch (``StopControl.checkpoint_epoch`` says which) and a resumed run replays the cut epoch whole.
A request during an evaluation lets it finish: the epoch is complete, so its checkpoint is written.

Several ranks (``ranks``, torch.distributed; ``trainer.distributed``): the model is wrapped in
DistributedDataParallel and each rank trains on its piece of every global batch (the source deals
them). Every decision that changes which collectives run next is taken identically on every rank:
stop requests are agreed at each step boundary (one all-reduce of a flag), the epoch's loss and
accuracy and the evaluation counts are summed over the ranks, so the metrics, the best epoch and
early stopping are the same everywhere. Only rank 0 logs epoch lines and writes the checkpoint,
which holds every rank's RNG states.
"""

import contextlib
import logging
import math
import random
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from proto.errors import UserError
from proto.progress import Progress
from trainer.batch import Batch
from trainer.checkpoint import (
    LEGACY_METRIC,
    Checkpoint,
    capture_rng,
    check_compatible,
    check_metric,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from trainer.device_cache import DeviceFeatureCache
from trainer.distributed import Peers, data_parallel, training_device
from trainer.metrics import TrainerMetrics
from trainer.models import MODELS, build_model
from trainer.ranks import SINGLE, Ranks
from trainer.scores import (
    METRIC_CHOICES,
    SHORT_NAMES,
    MetricChoice,
    accuracy_from_confusion,
    choose_metric,
    macro_f1_from_confusion,
    roc_auc,
)
from trainer.source import BatchSource

__all__ = ["TrainConfig", "EpochRecord", "TrainResult", "SequenceError", "SequenceCheck", "StopControl", "train",
           "resolve_device", "seed_everything", "format_epoch"]

log_ = logging.getLogger("megabatch.trainer")


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
    train_s: the training part of the epoch, eval_s the evaluation part.
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
                "stopped_on_request": self.stopped_on_request, "resumed_from_epoch": self.resumed_from_epoch}

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


class SequenceError(RuntimeError):
    """A batch arrived out of sequence: lost, duplicated or reordered on the way."""


class SequenceCheck:
    """Checks that ``seq`` numbers of one stream are consecutive (no gap, duplicate or reordering)."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.last: int | None = None

    def __call__(self, seq: int) -> None:
        if self.last is not None and seq != self.last + 1:
            what = "a duplicate or reordered batch" if seq <= self.last else f"{seq - self.last - 1} batch(es) lost"
            raise SequenceError(f"batch sequence broken in the {self.stream} stream: expected seq {self.last + 1} "
                                f"after {self.last}, got {seq} ({what})")
        self.last = seq


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
    ``val auc 0.912 acc 0.951  test auc 0.905 acc 0.948``.
    """
    val = _split_column(record.val_acc, record.val_score, metric)
    test = _split_column(record.test_acc, record.test_score, metric)
    return (f"epoch {record.epoch}/{total}  loss {record.loss:.3f}  train {record.train_acc:.3f}  val {val}  "
            f"test {test}  {record.samples_per_s:.0f} samples/s  data-wait {100 * record.data_wait:.1f}%")


def resolve_device(name: str, ranks: Ranks = SINGLE) -> torch.device:
    """"auto" -> cuda when available, else cpu; "cuda" without a GPU is a UserError. Several ranks on
    CUDA take GPU ``LOCAL_RANK`` each (``trainer.distributed.training_device``)."""
    return training_device(name, ranks)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's global and torch's (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class _Staged:
    host: Batch
    device: Batch
    copied: "torch.cuda.Event | None"


class _Stager:
    """Starts device copies on a side stream and hands batches over once their copy has landed.

    With a feature cache, ``finish`` also assembles each batch's full ``x`` on the device, on the
    compute stream, after its copy: only the shipped rows cross PCIe, and batches are assembled
    in the order they are finished, which is the order the source yields them. ``rows_shipped``
    and ``rows_cached`` count the rows of finished batches by origin (``take_rows`` resets them).
    """

    def __init__(self, device: torch.device, cache: DeviceFeatureCache | None = None) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.cache = cache
        self.rows_shipped = 0
        self.rows_cached = 0

    def take_rows(self) -> tuple[int, int]:
        """(shipped, cached) rows of the batches finished since the last call."""
        rows = self.rows_shipped, self.rows_cached
        self.rows_shipped = self.rows_cached = 0
        return rows

    def start(self, batch: Batch) -> _Staged:
        if self.stream is None:
            return _Staged(batch, batch.to(self.device), None)
        with torch.cuda.stream(self.stream):
            moved = batch.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return _Staged(batch, moved, event)

    def finish(self, staged: _Staged) -> Batch:
        if staged.copied is not None:
            # the slot is shared memory the producer overwrites once released: the copy must be complete
            staged.copied.synchronize()
            staged.host.release()
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(staged.copied)
            plan = staged.device.cache_plan
            for tensor in (staged.device.x, staged.device.y, staged.device.edge_index,
                           *(plan.tensors() if plan is not None else ())):
                tensor.record_stream(compute)  # memory allocated on the copy stream is used on this one
        batch = staged.device
        shipped = batch.x.shape[0]
        self.rows_shipped += shipped
        if batch.cache_plan is not None:
            if self.cache is None:
                raise RuntimeError("a batch carries a feature cache plan but the source has no feature cache")
            self.rows_cached += batch.cache_plan.hit_slot.shape[0] - shipped
            batch = self.cache.assemble_batch(batch)
        return batch

    def abandon(self, staged: _Staged) -> None:
        if staged.copied is not None:
            staged.copied.synchronize()
        staged.host.release()


def _prefetched(batches: Iterator[Batch], stager: _Stager, check: SequenceCheck
                ) -> Generator[tuple[Batch, float], None, None]:
    """(batch ready on the device, seconds waited for it), fetching and copying one batch ahead.

    On the way out (end, error, or the consumer closing it) every batch taken from ``batches``
    has been released, the one being consumed included: release is idempotent.
    """
    fetched: Batch | None = None
    staged: _Staged | None = None
    current: _Staged | None = None
    try:
        waited = 0.0
        while True:
            started = time.perf_counter()
            # finish first: on CUDA that hands the current slot back before blocking on the next one
            ready = stager.finish(current) if current is not None else None
            fetched = next(batches, None)
            if fetched is not None:
                check(fetched.seq)
                staged, fetched = stager.start(fetched), None
            waited += time.perf_counter() - started
            if ready is not None:
                yield ready, waited
                waited = 0.0
            if staged is None:
                return
            current, staged = staged, None
    finally:
        for pending in (current, staged):
            if pending is not None:
                stager.abandon(pending)
        if fetched is not None:
            fetched.release()
        close = getattr(batches, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class _Evaluation:
    """One split's evaluation: accuracy (0 without a labelled node) and the score by the run's metric."""

    accuracy: float
    score: float
    """NaN where the metric is undefined (e.g. AUC of a split holding one class)."""


def _score(value: float | None) -> float:
    return math.nan if value is None else value


def _model_signature(cfg: TrainConfig, in_dim: int, out_dim: int, num_layers: int) -> dict[str, Any]:
    signature: dict[str, Any] = {"model": cfg.model, "in_dim": in_dim, "hidden": cfg.hidden, "out_dim": out_dim,
                                 "num_layers": num_layers}
    if cfg.model == "gat":
        signature["heads"] = cfg.heads
    return signature


class _Run:
    """The state of one ``train`` call; methods in the order they run."""

    def __init__(self, source: BatchSource, cfg: TrainConfig, progress: bool, metrics: TrainerMetrics | None,
                 log: Callable[[str], None], control: StopControl, ranks: Ranks) -> None:
        self.source, self.cfg, self.metrics, self.ranks = source, cfg, metrics, ranks
        self.log = log if ranks.main else _quiet
        self.control = control
        self.progress = progress and sys.stderr.isatty() and ranks.main
        self.device = resolve_device(cfg.device, ranks)
        self.peers = Peers(ranks, self.device)
        info = source.info
        self.info = info
        self._check_same_dealing()
        # the same seed on every rank: the same initial weights (DDP broadcasts rank 0's anyway) and dropout seed
        seed_everything(cfg.seed)
        self.model = build_model(cfg.model, info.num_features, cfg.hidden, info.num_classes, info.num_hops,
                                 cfg.dropout, cfg.heads).to(self.device)
        self.train_model = data_parallel(self.model, ranks, self.device)
        """What training steps call: ``model`` itself, or its DDP wrapper under several ranks. Evaluation
        calls ``model``: ranks evaluate different numbers of batches and DDP's forward may be a collective."""
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.signature = _model_signature(cfg, info.num_features, info.num_classes, info.num_hops)
        cache = None
        if info.feature_cache_rows:
            cache = DeviceFeatureCache(info.feature_cache_rows, info.num_features, getattr(torch, info.feature_dtype),
                                       self.device)
            self.log(f"feature cache: {info.feature_cache_rows:,} rows ({cache.nbytes / 2**20:.1f} MiB) "
                     f"on {self.device}")
        self.stager = _Stager(self.device, cache)
        self.row_bytes = info.num_features * torch.empty(0, dtype=getattr(torch, info.feature_dtype)).element_size()
        self.result = TrainResult(cfg, str(self.device), info.description)
        self.bad_evals = 0
        self.next_epoch = 1
        self.steps = 0
        self.metric = "accuracy"  # set_metric replaces it before the first evaluation
        self.label_counts: torch.Tensor | None = None
        """Labels per class of the training batches seen so far, while ``auto`` waits for the class balance."""
        if metrics is not None:
            metrics.set_build_info(cfg.model, str(self.device))
        if not cfg.resume:  # a resumed run keeps the metric its checkpoint records (resume)
            self.first_metric()

    def first_metric(self) -> None:
        """Resolve ``cfg.metric`` now, or arrange to count the training labels ``auto`` needs for it."""
        cfg, info = self.cfg, self.info
        if cfg.metric != "auto" or info.num_classes != 2:
            self.set_metric(choose_metric(cfg.metric, info.num_classes, None))
        elif info.train_class_counts is not None:
            self.set_metric(choose_metric("auto", 2, info.train_class_counts), "from the source's training labels")
        else:
            # the daemon's handshake has no class balance: count the first epoch's labels, decided before its evaluation
            self.label_counts = torch.zeros(2, dtype=torch.int64, device=self.device)

    def set_metric(self, choice: MetricChoice, origin: str | None = None) -> None:
        reason = choice.reason if origin is None else f"{choice.reason}; {origin}"
        self.metric = choice.metric
        self.result.metric, self.result.metric_reason = choice.metric, reason
        log_.info("metric %s (%s)", choice.metric, reason)

    def resume(self) -> None:
        path = self.cfg.checkpoint
        assert path is not None  # TrainConfig refuses resume without a checkpoint
        ckpt = load_checkpoint(path)
        check_compatible(path, ckpt, self.signature)
        check_metric(path, ckpt, self.cfg.metric)
        world = self.ranks.world_size
        if ckpt.world_size != world and self.ranks.main:
            log_.warning("%s was written by %d rank(s), this run has %d: the rest of the run deals its batches "
                         "differently from the interrupted one", path, ckpt.world_size, world)
        rank_rng = ckpt.rank_rng
        rng = rank_rng[self.ranks.rank] if rank_rng is not None and len(rank_rng) == world else ckpt.rng
        try:
            self.model.load_state_dict(ckpt.model_state)
            self.optimizer.load_state_dict(ckpt.optimizer_state)
            # a checkpoint from before metrics were selectable: its scores are its accuracies
            history = [EpochRecord(**{"val_score": record["val_acc"], "test_score": record["test_acc"], **record})
                       for record in ckpt.history]
            progress = ckpt.progress
            self.result.best_epoch = progress["best_epoch"]
            self.result.best_val_score = progress["best_val"]
            self.result.test_acc_at_best = progress["best_test"]
            self.result.best_val_acc = progress.get("best_val_acc", progress["best_val"])
            self.result.test_score_at_best = progress.get("best_test_score", progress["best_test"])
            self.result.stopped_early = bool(progress["stopped_early"])
            self.bad_evals = int(progress["bad_evals"])
            restore_rng(rng)
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(f"{path}: checkpoint does not fit this model ({first[:200]})") from None
        for group in self.optimizer.param_groups:  # this run's hyperparameters, not the checkpoint's
            group["lr"], group["weight_decay"] = self.cfg.lr, self.cfg.weight_decay
        self.result.epochs = history
        self.result.resumed_from_epoch = ckpt.epoch
        self.control.checkpoint_epoch = ckpt.epoch
        self.next_epoch = ckpt.epoch + 1
        self.log(f"resumed from {path} after epoch {ckpt.epoch}")
        reason = progress.get("metric_reason") or f"written before checkpoints recorded a metric: {LEGACY_METRIC}"
        self.set_metric(MetricChoice(ckpt.metric, "as in the checkpoint"), reason)

    def _check_same_dealing(self) -> None:
        """Several ranks: their sources must deal one epoch (the daemons of a job on several machines may
        be configured apart); a difference would train a different epoch per machine, or hang in DDP."""
        if not self.ranks.distributed:
            return
        dealings = self.peers.gather_objects(self.info.dealing)
        if len(set(dealings)) > 1:
            groups: dict[str, list[int]] = {}
            for rank, dealing in enumerate(dealings):
                groups.setdefault(dealing or "(not said)", []).append(rank)
            described = "; ".join(f"ranks {', '.join(map(str, ranks))}: {dealing}" for dealing, ranks in groups.items())
            raise UserError(f"the ranks' loader daemons deal different epochs ({described}): every machine needs the "
                            f"same prepared dataset, [loader] mode, [sampler] and [hierarchy] settings and budget")

    def train_epoch(self, epoch: int) -> EpochRecord:
        self.model.train()
        total_loss, correct, labelled, samples, batches = 0.0, 0, 0, 0, 0
        wait_s = step_s = 0.0
        expected = -(-self.info.train_nodes // (self.info.batch_size * self.ranks.world_size))
        started = time.perf_counter()
        check = SequenceCheck(f"train (epoch {epoch})")
        self.stager.take_rows()  # forget the rows of evaluation batches
        with (Progress(f"epoch {epoch}/{self.cfg.epochs}", expected, "batches", enabled=self.progress) as bar,
              contextlib.closing(_prefetched(iter(self.source.train_batches(epoch)), self.stager, check)) as stream):
            for batch, waited in stream:
                if self.stop_requested():
                    # a step boundary: the step before finished; closing the stream releases this batch
                    self.result.stopped_on_request = True
                    break
                step_started = time.perf_counter()
                self.optimizer.zero_grad(set_to_none=True)
                logits = self.train_model(batch.x, batch.edge_index, batch.num_sampled_nodes,
                                          batch.num_sampled_edges)
                loss, summed = self.loss(logits, batch)
                loss.backward()
                self.optimizer.step()
                mask = batch.y >= 0
                batch_correct = int((logits.argmax(1)[mask] == batch.y[mask]).sum())  # also waits for the GPU
                if self.label_counts is not None:
                    self.label_counts += torch.bincount(batch.y[mask], minlength=2)[:2]
                batch_labelled = int(mask.sum())
                total_loss += summed.item() if summed is not None else loss.item() * batch_labelled
                batch.release()
                step = time.perf_counter() - step_started
                correct, labelled = correct + batch_correct, labelled + batch_labelled
                samples, batches = samples + batch.batch_size, batches + 1
                wait_s, step_s = wait_s + waited, step_s + step
                if self.metrics is not None:
                    self.metrics.observe_batch(waited, step, batch.batch_size)
                    shipped, cached = self.stager.take_rows()
                    self.metrics.observe_features(shipped * self.row_bytes, cached * self.row_bytes)
                bar.update()
                self.steps += 1
                if self.cfg.max_steps is not None and self.steps >= self.cfg.max_steps:
                    # closing the stream releases the prefetched batch and ends the source's epoch early
                    self.result.stopped_at_max_steps = True
                    break
        train_s = time.perf_counter() - started
        busy = wait_s + step_s
        if self.ranks.distributed:
            # the epoch's loss, accuracy and throughput over every rank's pieces; timings stay this rank's
            totals = self.peers.sum(torch.tensor([total_loss, correct, labelled, samples], dtype=torch.float64))
            total_loss = float(totals[0])
            correct, labelled, samples = (int(v) for v in totals[1:].tolist())
        return EpochRecord(epoch=epoch, loss=total_loss / max(1, labelled), train_acc=correct / max(1, labelled),
                           val_acc=None, test_acc=None, batches=batches, samples=samples,
                           samples_per_s=samples / train_s if train_s > 0 else 0.0, wait_s=wait_s, step_s=step_s,
                           data_wait=wait_s / busy if busy > 0 else 0.0, train_s=train_s, eval_s=0.0)

    def stop_requested(self) -> bool:
        """Whether to stop at this step boundary: under several ranks, whether any rank was asked to (every
        rank must stop at the same step, or the others would wait for it in the next all-reduce)."""
        return self.peers.any(self.control.requested)

    def loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The loss to backpropagate, and under several ranks the sum of its seeds' losses (for the log).

        One process: the mean over the batch's labelled seeds. Several ranks: the sum over this rank's
        seeds times W / (seeds of the global batch). DDP averages the ranks' gradients, that is divides
        their sum by W, so the step follows the gradient of the mean loss over the whole global batch,
        however unevenly its seeds were dealt (the last step's pieces may differ by one, or be empty). A
        plain mean per rank would weigh the seeds of a short piece more. Splits hold labelled nodes only
        (``megabatch import`` refuses others), so the global batch's seeds are its labelled seeds. An
        empty piece still has a loss attached to every parameter (a sum over no seeds, 0): its backward
        joins DDP's all-reduce like every other rank's.
        """
        if not self.ranks.distributed:
            return F.cross_entropy(logits, batch.y, ignore_index=-1), None
        if batch.global_seeds is None:
            raise RuntimeError("a training batch under DDP does not say how many seeds its global batch holds "
                               "(the source does not deal batches to ranks)")
        summed = F.cross_entropy(logits, batch.y, ignore_index=-1, reduction="sum")
        return summed * (self.ranks.world_size / max(1, batch.global_seeds)), summed.detach()

    def decide_metric(self, epoch: int) -> None:
        """Resolve ``auto`` from the labels counted in this epoch's training batches (first epoch only)."""
        if self.label_counts is None:
            return
        counts = [int(c) for c in self.peers.sum(self.label_counts).tolist()]
        self.label_counts = None
        self.set_metric(choose_metric("auto", 2, counts), f"counted in the training batches of epoch {epoch}")

    @torch.no_grad()
    def evaluate(self, split: str) -> _Evaluation:
        """Accuracy and the score by ``self.metric`` over the labelled nodes of ``split``.

        Every metric gets the confusion matrix (accumulated on the device, C x C counts); roc_auc
        also keeps each labelled node's log-probabilities on the host (n x C float32), ranked
        the same as softmax probabilities but without float32 rounding near-certain ones to 1.
        """
        self.model.eval()
        classes = self.info.num_classes
        confusion = torch.zeros(classes * classes, dtype=torch.int64, device=self.device)
        scores: list[torch.Tensor] = []
        labels: list[torch.Tensor] = []
        check = SequenceCheck(f"{split} evaluation")
        # each rank evaluates its share of the batches; the counts (and AUC's scores) are pooled below
        with contextlib.closing(_prefetched(iter(self.source.eval_batches(split)), self.stager, check)) as stream:
            for batch, _ in stream:
                logits = self.model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
                mask = batch.y >= 0
                y = batch.y[mask]
                counts = torch.bincount(y * classes + logits.argmax(1)[mask], minlength=classes * classes)
                if counts.numel() != classes * classes:
                    raise ValueError(f"a {split} label is not below num_classes {classes}")
                confusion += counts
                if self.metric == "roc_auc":
                    scores.append(torch.log_softmax(logits[mask].float(), dim=1).cpu())
                    labels.append(y.cpu())
                batch.release()
        matrix = self.peers.sum(confusion).view(classes, classes).cpu().numpy()
        # no labelled node: accuracy 0 as before, so dashboards and scripts keep a number
        acc = accuracy_from_confusion(matrix) if matrix.sum() else 0.0
        if self.metric == "roc_auc":
            # AUC ranks every score of the split against every other: every rank gets them all, in rank order
            all_scores = self.peers.gather_rows(torch.cat(scores) if scores else torch.zeros((0, classes)))
            all_labels = self.peers.gather_rows(torch.cat(labels) if labels else torch.zeros(0, dtype=torch.int64))
            score = roc_auc(all_scores.numpy(), all_labels.numpy())
        elif self.metric == "macro_f1":
            score = macro_f1_from_confusion(matrix)
        else:
            score = acc
        return _Evaluation(accuracy=acc, score=score)

    def run_epoch(self, epoch: int) -> bool:
        """Train, maybe evaluate, record, checkpoint; True when early stopping says stop."""
        cfg = self.cfg
        record = self.train_epoch(epoch)
        if self.result.stopped_on_request:
            self.log(f"stop requested: epoch {epoch} cut after {record.batches} steps; not evaluated, "
                     f"recorded or checkpointed")
            return True
        cut = self.result.stopped_at_max_steps
        self.decide_metric(epoch)
        if not cut and (epoch % cfg.eval_every == 0 or epoch == cfg.epochs):
            started = time.perf_counter()
            val, test = self.evaluate("val"), self.evaluate("test")
            record.val_acc, record.test_acc, record.val_score, record.test_score = (val.accuracy, test.accuracy,
                                                                                    val.score, test.score)
            record.eval_s = time.perf_counter() - started
            best = self.result.best_val_score
            # NaN (an undefined score) is never an improvement: it compares false either way
            if not math.isnan(val.score) and (best is None or val.score > best):
                self.result.best_epoch = epoch
                self.result.best_val_score, self.result.test_score_at_best = val.score, test.score
                self.result.best_val_acc, self.result.test_acc_at_best = val.accuracy, test.accuracy
                self.bad_evals = 0
            else:
                self.bad_evals += 1
        self.result.epochs.append(record)
        stop = cfg.patience is not None and self.bad_evals >= cfg.patience and epoch < cfg.epochs
        self.result.stopped_early = stop
        stop = stop or cut
        if self.metrics is not None:
            self.metrics.observe_epoch(epoch, record.loss, record.train_acc, record.samples_per_s, record.data_wait)
            if record.val_acc is not None and record.test_acc is not None:
                self.metrics.observe_eval("val", record.val_acc, self.metric, _score(record.val_score))
                self.metrics.observe_eval("test", record.test_acc, self.metric, _score(record.test_score))
        self.log(format_epoch(record, cfg.epochs, self.metric))
        if cfg.checkpoint is not None:
            self.save(epoch)
        return stop

    def save(self, epoch: int) -> None:
        assert self.cfg.checkpoint is not None
        # every rank's RNG states (dropout streams differ by rank once batch shapes do), so that a resumed
        # run continues each rank where it left off; gathered by every rank, written by rank 0 alone
        rank_rng = self.peers.gather_objects(capture_rng()) if self.ranks.distributed else None
        if not self.ranks.main:
            return
        self.control.writing = epoch
        # best_val/best_test keep their first meaning (best score, test accuracy there): with metric
        # accuracy, a checkpoint reads the same to a trainer from before metrics were selectable
        progress = {"best_epoch": self.result.best_epoch, "best_val": self.result.best_val_score,
                    "best_test": self.result.test_acc_at_best, "best_val_acc": self.result.best_val_acc,
                    "best_test_score": self.result.test_score_at_best, "bad_evals": self.bad_evals,
                    "stopped_early": self.result.stopped_early, "metric_reason": self.result.metric_reason}
        save_checkpoint(self.cfg.checkpoint, Checkpoint(
            epoch=epoch, model_state=self.model.state_dict(), optimizer_state=self.optimizer.state_dict(),
            signature=self.signature, config=self.cfg.to_json(), progress=progress,
            history=[asdict(r) for r in self.result.epochs], rng=capture_rng() if rank_rng is None else rank_rng[0],
            metric=self.metric, world_size=self.ranks.world_size, rank_rng=rank_rng))
        self.control.checkpoint_epoch, self.control.writing = epoch, None


def _quiet(line: str) -> None:
    """The epoch log of ranks other than 0."""


def train(source: BatchSource, cfg: TrainConfig, *, progress: bool = False, metrics: TrainerMetrics | None = None,
          log: Callable[[str], None] | None = None, control: StopControl | None = None,
          ranks: Ranks = SINGLE) -> TrainResult:
    """Train a ``cfg.model`` on ``source`` for ``cfg.epochs`` epochs (fewer when early stopping fires).

    ``progress`` draws a bar per epoch when stderr is a terminal (default False); ``metrics``
    receives per-batch and per-epoch values (default None); ``log`` gets one line per epoch
    (default: the "megabatch.trainer" logger at INFO). ``result.model`` is the trained model.
    ``control`` (default None: none) stops the run at a step boundary on request and reports which
    epoch the checkpoint file holds (``StopControl``). ``ranks`` (default: a single process): this
    process's place among several training ranks, whose process group is already initialised
    (``trainer.distributed.process_group``) and whose ``source`` yields this rank's share; only rank 0
    logs and writes the checkpoint.
    """
    control = control if control is not None else StopControl()
    run = _Run(source, cfg, progress, metrics, log if log is not None else log_.info, control, ranks)
    if cfg.resume:
        run.resume()
        if run.result.stopped_early:
            run.log(f"the checkpointed run had stopped early after epoch {run.next_epoch - 1}; nothing to do")
            run.result.model = run.model
            return run.result
    for epoch in range(run.next_epoch, cfg.epochs + 1):
        if run.stop_requested():
            run.result.stopped_on_request = True
            break
        if run.run_epoch(epoch):
            break
    run.result.model = run.model
    return run.result
