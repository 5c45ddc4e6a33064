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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from proto.errors import UserError
from trainer.batch import Batch
from trainer.checkpoint import (
    LEGACY_METRIC,
    Checkpoint,
    capture_rng,
    check_compatible,
    check_metric,
    check_task,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from trainer.device_cache import DeviceFeatureCache
from trainer.distributed import Peers, data_parallel, training_device
from trainer.metrics import TrainerMetrics
from trainer.micro_batches import CUDA_STEP_OVERHEAD, MicroBatching, ModelShape
from trainer.models import AGGREGATION_FOR, build_model
from trainer.optimizer import adam
from trainer.prefetch import SequenceCheck, SequenceError, Stager, prefetched
from trainer.progress import DEFAULT_INTERVAL_S, EpochProgress
from trainer.provenance import CodeSpan, resumed_spans, running_code
from trainer.ranks import SINGLE, Ranks
from trainer.records import EpochRecord, StopControl, TrainConfig, TrainResult, format_epoch
from trainer.scores import (
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


def resolve_device(name: str, ranks: Ranks = SINGLE) -> torch.device:
    """"auto" -> cuda when available, else cpu; "cuda" without a GPU is a UserError. Several ranks on
    CUDA take GPU ``LOCAL_RANK`` each (``trainer.distributed.training_device``)."""
    return training_device(name, ranks)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's global and torch's (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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
                 log: Callable[[str], None], control: StopControl, ranks: Ranks,
                 progress_interval: float = DEFAULT_INTERVAL_S) -> None:
        self.source, self.cfg, self.metrics, self.ranks = source, cfg, metrics, ranks
        self.log = log if ranks.main else _quiet
        self.control = control
        self.progress = progress and ranks.main
        self.progress_interval = progress_interval
        self.device = resolve_device(cfg.device, ranks)
        self.peers = Peers(ranks, self.device)
        info = source.info
        self.info = info
        self._check_same_dealing()
        # the same seed on every rank: the same initial weights (DDP broadcasts rank 0's anyway) and dropout seed
        seed_everything(cfg.seed)
        if info.aggregation and AGGREGATION_FOR.get(cfg.model) != info.aggregation:
            raise UserError(f"aggregation cache: the batches carry a {info.aggregation!r} one; --model {cfg.model} "
                            + (f"reads a {AGGREGATION_FOR[cfg.model]!r} one (megabatch aggregate --kind "
                               f"{AGGREGATION_FOR[cfg.model]})" if cfg.model in AGGREGATION_FOR
                               else "reads none (attention needs every edge)"))
        self.model = build_model(cfg.model, info.num_features, cfg.hidden, info.num_classes, info.num_hops,
                                 cfg.dropout, cfg.heads, info.aggregation).to(self.device)
        self.train_model = data_parallel(self.model, ranks, self.device)
        """What training steps call: ``model`` itself, or its DDP wrapper under several ranks. Evaluation
        calls ``model``: ranks evaluate different numbers of batches and DDP's forward may be a collective."""
        self.optimizer = adam(self.model.parameters(), cfg.lr, cfg.weight_decay)
        self.signature = _model_signature(cfg, info.num_features, info.num_classes, info.num_hops)
        cache = None
        if info.feature_cache_rows:
            cache = DeviceFeatureCache(info.feature_cache_rows, info.num_features, getattr(torch, info.feature_dtype),
                                       self.device)
            self.log(f"feature cache: {info.feature_cache_rows:,} rows ({cache.nbytes / 2**20:.1f} MiB) "
                     f"on {self.device}")
        source.pin_for(self.device)
        self.stager = Stager(self.device, cache)
        shape = ModelShape(cfg.model, info.num_features, cfg.hidden, info.num_classes, info.num_hops, cfg.heads,
                           torch.empty(0, dtype=getattr(torch, info.feature_dtype)).element_size(),
                           CUDA_STEP_OVERHEAD if self.device.type == "cuda" else 0)
        self.micro = MicroBatching(cfg.micro_batches, cfg.device_memory, shape, cfg.seed)
        self.train_stager = self.stager
        """Training batches' stager: on CUDA with micro-batches, one that keeps them on the host, where they are
        cut, so that only one micro-batch at a time is on the device (the whole batch may not fit there)."""
        if self.micro.enabled and self.device.type == "cuda":
            if cache is not None:
                raise UserError("--feature-cache does not combine with --micro-batches or --device-memory on CUDA: "
                                "the cache assembles whole batches on the device, micro-batches are cut on the host")
            self.train_stager = Stager(torch.device("cpu"))
        self.row_bytes = info.num_features * torch.empty(0, dtype=getattr(torch, info.feature_dtype)).element_size()
        self.result = TrainResult(cfg, str(self.device), info.description, code=[CodeSpan(1, running_code())])
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
        check_task(path, ckpt, "node")
        check_compatible(path, ckpt, self.signature)
        check_metric(path, ckpt, self.cfg.metric)
        world = self.ranks.world_size
        if ckpt.world_size != world and self.ranks.main:
            log_.warning("%s was written by %d rank(s), this run has %d: the rest of the run deals its batches "
                         "differently from the interrupted one", path, ckpt.world_size, world)
        code = resumed_spans(path, ckpt.code, ckpt.epoch, running_code(), log_.warning if self.ranks.main else None)
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
        self.result.code = code
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
        started = time.perf_counter()
        check = SequenceCheck(f"train (epoch {epoch})")
        self.train_stager.take_rows()  # forget the rows and copies of evaluation batches
        self.train_stager.take_copies()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        source_batches = iter(self.source.train_batches(epoch))
        with (EpochProgress(epoch, self.cfg.epochs, enabled=self.progress, interval_s=self.progress_interval) as bar,
              contextlib.closing(prefetched(source_batches, self.train_stager, check)) as stream):
            for batch, waited in stream:
                if self.stop_requested():
                    # a step boundary: the step before finished; closing the stream releases this batch
                    self.result.stopped_on_request = True
                    break
                step_started = time.perf_counter()
                self.optimizer.zero_grad(set_to_none=True)
                logits, summed = self.forward_backward(batch)
                self.optimizer.step()
                y = batch.y.to(logits.device)  # a batch cut into micro-batches stayed on the host
                mask = y >= 0
                batch_correct = int((logits.argmax(1)[mask] == y[mask]).sum())  # also waits for the GPU
                if self.label_counts is not None:
                    self.label_counts += torch.bincount(y[mask], minlength=2)[:2]
                batch_labelled = int(mask.sum())
                total_loss += summed
                batch.release()
                step = time.perf_counter() - step_started
                correct, labelled = correct + batch_correct, labelled + batch_labelled
                samples, batches = samples + batch.batch_size, batches + 1
                wait_s, step_s = wait_s + waited, step_s + step
                if self.metrics is not None:
                    self.metrics.observe_batch(waited, step, batch.batch_size)
                    shipped, cached = self.train_stager.take_rows()
                    self.metrics.observe_features(shipped * self.row_bytes, cached * self.row_bytes)
                bar.update(batch.stream_batches, batch.batch_size, waited, step)
                self.steps += 1
                if self.cfg.max_steps is not None and self.steps >= self.cfg.max_steps:
                    # closing the stream releases the prefetched batch and ends the source's epoch early
                    self.result.stopped_at_max_steps = True
                    break
        train_s = time.perf_counter() - started
        h2d_bytes, h2d_s = self.train_stager.take_copies()
        split, micro, redundancy = self.micro.take_stats()
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else 0
        busy = wait_s + step_s
        if self.ranks.distributed:
            # the epoch's loss, accuracy and throughput over every rank's pieces; timings stay this rank's
            totals = self.peers.sum(torch.tensor([total_loss, correct, labelled, samples], dtype=torch.float64))
            total_loss = float(totals[0])
            correct, labelled, samples = (int(v) for v in totals[1:].tolist())
        return EpochRecord(epoch=epoch, loss=total_loss / max(1, labelled), train_acc=correct / max(1, labelled),
                           val_acc=None, test_acc=None, batches=batches, samples=samples,
                           samples_per_s=samples / train_s if train_s > 0 else 0.0, wait_s=wait_s, step_s=step_s,
                           data_wait=wait_s / busy if busy > 0 else 0.0, train_s=train_s, eval_s=0.0,
                           h2d_bytes=h2d_bytes, h2d_s=h2d_s, split_batches=split, micro_batches=micro,
                           input_redundancy=redundancy, peak_device_bytes=peak)

    def forward_backward(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """Forward and backward of one training batch, whole or as micro-batches (``cfg.micro_batches`` or
        ``cfg.device_memory``): the seeds' logits and the sum of their losses (for the log). Split, each
        micro-batch's loss is its seeds' summed loss over the batch's labelled seeds (under DDP: times W over
        the global batch's seeds, as ``loss``), so the accumulated gradient is the whole batch's; under DDP
        only the last micro-batch's backward all-reduces."""
        parts = self.micro.split(batch)
        if parts is None:
            batch = batch.to(self.device)  # a no-op unless the batch was kept on the host to be cut
            logits = self.train_model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges,
                                      batch.x_agg)
            loss, summed = self.loss(logits, batch)
            loss.backward()
            return logits, summed.item() if summed is not None else loss.item() * int((batch.y >= 0).sum())
        scale = self.rank_scale(batch) if self.ranks.distributed else 1 / max(1, int((batch.y >= 0).sum()))
        logits = torch.empty((batch.batch_size, self.info.num_classes), device=self.device)
        total = 0.0
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            if not last and isinstance(self.train_model, torch.nn.parallel.DistributedDataParallel):
                sync = self.train_model.no_sync()  # gradients accumulate locally; the last backward all-reduces
            with sync:
                b = part.batch.to(self.device)
                out = self.train_model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges, b.x_agg)
                summed = F.cross_entropy(out, b.y, weight=b.class_weight, ignore_index=-1, reduction="sum")
                (summed * scale).backward()
            logits[part.seeds.to(logits.device)] = out.detach()
            total += summed.item()
        return logits, total

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

        With ``batch.class_weight`` each seed's loss is weighed by its class's weight, and the sum still divided by
        the seeds (not by the weights' sum, as PyTorch's weighted mean does): the weights are importance weights,
        so the loss is, in expectation, the epoch's label mix's.
        """
        weight = batch.class_weight
        if not self.ranks.distributed:
            if weight is None:
                return F.cross_entropy(logits, batch.y, ignore_index=-1), None
            summed = F.cross_entropy(logits, batch.y, weight=weight, ignore_index=-1, reduction="sum")
            return summed / max(1, int((batch.y >= 0).sum())), None
        summed = F.cross_entropy(logits, batch.y, weight=weight, ignore_index=-1, reduction="sum")
        return summed * self.rank_scale(batch), summed.detach()

    def rank_scale(self, batch: Batch) -> float:
        """Under several ranks, what a piece's summed loss is multiplied by: W / (seeds of the global batch)."""
        if batch.global_seeds is None:
            raise RuntimeError("a training batch under DDP does not say how many seeds its global batch holds "
                               "(the source does not deal batches to ranks)")
        return self.ranks.world_size / max(1, batch.global_seeds)

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
        with contextlib.closing(prefetched(iter(self.source.eval_batches(split)), self.stager, check)) as stream:
            for batch, _ in stream:
                logits = self.model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges,
                                    batch.x_agg)
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
            metric=self.metric, world_size=self.ranks.world_size, rank_rng=rank_rng, code=self.result.code))
        self.control.checkpoint_epoch, self.control.writing = epoch, None


def _quiet(line: str) -> None:
    """The epoch log of ranks other than 0."""


def train(source: BatchSource, cfg: TrainConfig, *, progress: bool = False, metrics: TrainerMetrics | None = None,
          log: Callable[[str], None] | None = None, control: StopControl | None = None,
          ranks: Ranks = SINGLE, progress_interval: float = DEFAULT_INTERVAL_S) -> TrainResult:
    """Train a ``cfg.model`` on ``source`` for ``cfg.epochs`` epochs (fewer when early stopping fires).

    ``progress`` draws a bar per epoch when stderr is a terminal, else logs a progress line every
    ``progress_interval`` seconds (0: every step) (default False: neither; ``trainer.progress``); ``metrics``
    receives per-batch and per-epoch values (default None); ``log`` gets one line per epoch
    (default: the "megabatch.trainer" logger at INFO). ``result.model`` is the trained model.
    ``control`` (default None: none) stops the run at a step boundary on request and reports which
    epoch the checkpoint file holds (``StopControl``). ``ranks`` (default: a single process): this
    process's place among several training ranks, whose process group is already initialised
    (``trainer.distributed.process_group``) and whose ``source`` yields this rank's share; only rank 0
    logs and writes the checkpoint.
    """
    control = control if control is not None else StopControl()
    run = _Run(source, cfg, progress, metrics, log if log is not None else log_.info, control, ranks,
               progress_interval)
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
