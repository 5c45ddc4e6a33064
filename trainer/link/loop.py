"""The link-prediction training loop: a ``LinkSource`` (in memory or from the daemon) in, a trained ``LinkModel``
and per-epoch records out (``megabatch train --task link``).

An epoch trains on every training positive once (``source.train_batches``), with BCE-with-logits on
each batch's positives (label 1) and negatives (label 0). Evaluation (every ``eval_every`` epochs and
after the last) embeds the nodes the split's scores need and ranks each held-out positive against its
fixed negative tails (``trainer.link.ranking``). Validation picks the best epoch and drives
``patience``; the test split is evaluated where validation improved, so the test scores reported are
those of the best validation epoch, as the node task reports them, without evaluating test every epoch.

Determinism, stopping and checkpoints are the node loop's (``trainer.loop``): the source fixes each
epoch's batches and each evaluation's neighbourhoods, ``seed`` the initial weights and dropout; a stop
request is honoured at the next step boundary, the cut epoch neither evaluated nor checkpointed; a
checkpoint holds a completed epoch with every RNG state, so a resumed run ends with the same model as an
uninterrupted one (bitwise on CPU). A checkpoint records its task: a node run's cannot resume a link run
and the other way round (``trainer.checkpoint.check_task``).

Several ranks (``--nproc-per-node``, DDP) train the node loop's way: each takes its piece of every global
batch (``LinkInMemorySource(rank, world_size)``), the loss of a piece is its pairs' summed BCE times W over
the global batch's pairs, so DDP's average is the gradient of the global batch's mean; every rank evaluates
the whole split (the same scores on each; the held-out splits are small beside training) and rank 0 alone
logs and writes the checkpoint (the weights are the same on every rank after each step).
"""

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from proto.errors import UserError
from trainer.checkpoint import (
    Checkpoint,
    capture_rng,
    check_compatible,
    check_metric,
    check_task,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from trainer.distributed import Peers, data_parallel, training_device
from trainer.link.batches import LinkBatch
from trainer.link.model import LinkModel
from trainer.link.ranking import DEFAULT_LINK_METRIC, link_scores
from trainer.link.records import LinkConfig, LinkEpochRecord, LinkResult, format_link_epoch
from trainer.link.source import LinkSource
from trainer.loop import seed_everything
from trainer.metrics import TrainerMetrics
from trainer.optimizer import adam
from trainer.progress import DEFAULT_INTERVAL_S, EpochProgress
from trainer.provenance import CodeSpan, resumed_spans, running_code
from trainer.ranks import SINGLE, Ranks
from trainer.records import StopControl

__all__ = ["train_link", "EVAL_PAIR_CELLS"]


def _quiet(line: str) -> None:
    """The log of a rank other than 0: its lines would repeat rank 0's."""

log_ = logging.getLogger("megabatch.trainer")

EVAL_PAIR_CELLS = 1 << 24
"""Floats of pair products decoded at a time in an evaluation (64 MiB): bounds the (E, K, hidden) product of
the positives' sources and their negative tails, which a large split would not fit on a GPU at once."""


class _LinkRun:
    """The state of one ``train_link`` call; methods in the order they run."""

    def __init__(self, source: LinkSource, cfg: LinkConfig, progress: bool, progress_interval: float,
                 metrics: TrainerMetrics | None, log: Callable[[str], None], control: StopControl,
                 ranks: Ranks = SINGLE) -> None:
        self.source, self.cfg, self.metrics, self.control, self.ranks = source, cfg, metrics, control, ranks
        self.log = log if ranks.main else _quiet
        self.progress, self.progress_interval = progress and ranks.main, progress_interval
        train = cfg.train
        self.device = training_device(train.device, ranks)
        self.peers = Peers(ranks, self.device)
        seed_everything(train.seed)
        self.model = LinkModel(train.model, source.num_features, train.hidden, source.num_hops, train.dropout,
                               train.heads, cfg.decoder).to(self.device)
        self.train_model = data_parallel(self.model, ranks, self.device)
        """What training steps call: the model, or its DDP wrapper under several ranks (evaluation calls the model)."""
        self.optimizer = adam(self.model.parameters(), train.lr, train.weight_decay)
        self.averaged = None if not cfg.ema else AveragedModel(
            self.model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema), use_buffers=True)
        """The moving average of the weights after each step (``cfg.ema``), what evaluation runs and the run returns:
        it smooths the last steps' noise, worth about 2 MRR points to the shuffled order on Cora and citeseer and
        less to the buffer orders (docs/PERFORMANCE.md, "A moving average of the weights")."""
        self.signature: dict[str, Any] = {"task": "link", "model": train.model, "in_dim": source.num_features,
                                          "hidden": train.hidden, "num_layers": source.num_hops,
                                          "decoder": cfg.decoder}
        if train.model == "gat":
            self.signature["heads"] = train.heads
        self.result = LinkResult(cfg, str(self.device), source.description, code=[CodeSpan(1, running_code())],
                                 buffer=None if source.buffer is None else source.buffer.to_json())
        if cfg.metric == "auto":
            self.set_metric(DEFAULT_LINK_METRIC, "auto: link prediction, each held-out positive ranked against its "
                                                 "own negatives")
        else:
            self.set_metric(cfg.metric, "as requested")
        if metrics is not None:
            metrics.set_build_info(train.model, str(self.device))
        self.bad_evals = 0
        self.next_epoch = 1
        self.steps = 0

    def set_metric(self, metric: str, reason: str) -> None:
        self.metric = metric
        self.result.metric, self.result.metric_reason = metric, reason
        log_.info("metric %s (%s)", metric, reason)

    def resume(self) -> None:
        path = self.cfg.train.checkpoint
        assert path is not None  # TrainConfig refuses resume without a checkpoint
        ckpt = load_checkpoint(path)
        check_task(path, ckpt, "link")
        check_compatible(path, ckpt, self.signature)
        check_metric(path, ckpt, self.cfg.metric)
        if (ckpt.averaged_state is None) != (self.averaged is None):
            had = "without" if ckpt.averaged_state is None else "with"
            raise UserError(f"{path}: the run was checkpointed {had} a moving average of its weights; resume it "
                            f"{had} one (--ema {'0' if had == 'without' else 'DECAY'})")
        code = resumed_spans(path, ckpt.code, ckpt.epoch, running_code(), log_.warning if self.ranks.main else None)
        try:
            self.model.load_state_dict(ckpt.model_state)
            self.optimizer.load_state_dict(ckpt.optimizer_state)
            if self.averaged is not None:
                self.averaged.load_state_dict(cast(dict[str, Any], ckpt.averaged_state))
            history = [LinkEpochRecord(**record) for record in ckpt.history]
            progress = ckpt.progress
            result = self.result
            result.best_epoch, result.best_val_score = progress["best_epoch"], progress["best_val"]
            result.test_score_at_best = progress["best_test"]
            result.best_val, result.test_at_best = progress["best_val_scores"], progress["test_at_best"]
            result.stopped_early = bool(progress["stopped_early"])
            self.bad_evals = int(progress["bad_evals"])
            restore_rng(ckpt.rng)
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(f"{path}: checkpoint does not fit this model ({first[:200]})") from None
        for group in self.optimizer.param_groups:  # this run's hyperparameters, not the checkpoint's
            group["lr"], group["weight_decay"] = self.cfg.train.lr, self.cfg.train.weight_decay
        self.result.epochs = history
        self.result.resumed_from_epoch = ckpt.epoch
        self.result.code = code
        self.control.checkpoint_epoch = ckpt.epoch
        self.next_epoch = ckpt.epoch + 1
        self.log(f"resumed from {path} after epoch {ckpt.epoch}")
        self.set_metric(ckpt.metric, f"as in the checkpoint; {progress.get('metric_reason')}")

    def train_epoch(self, epoch: int) -> LinkEpochRecord:
        self.model.train()
        total_loss, pairs, positives, batches = 0.0, 0, 0, 0
        wait_s = step_s = 0.0
        started = time.perf_counter()
        with (EpochProgress(epoch, self.cfg.train.epochs, enabled=self.progress,
                            interval_s=self.progress_interval) as bar,
              contextlib.closing(self.source.train_batches(epoch)) as stream):
            while True:
                waiting = time.perf_counter()
                batch = next(stream, None)  # sampling happens here: the wait for data
                if batch is None:
                    break
                if self.peers.any(self.control.requested):  # every rank stops at the same step boundary
                    self.result.stopped_on_request = True  # a step boundary: the step before finished
                    batch.release()
                    break
                try:
                    summed_loss, labelled, waited, step = self._step(batch.to(self.device), waiting)
                finally:
                    batch.release()  # the step has read the slot's views (or their device copy)
                total_loss += summed_loss
                pairs, positives, batches = pairs + labelled, positives + batch.positives, batches + 1
                wait_s, step_s = wait_s + waited, step_s + step
                if self.metrics is not None:
                    self.metrics.observe_batch(waited, step, batch.positives)
                bar.update(batch.stream_batches, batch.positives, waited, step)
                self.steps += 1
                max_steps = self.cfg.train.max_steps
                if max_steps is not None and self.steps >= max_steps:
                    self.result.stopped_at_max_steps = True
                    break
        train_s = time.perf_counter() - started
        busy = wait_s + step_s
        if self.ranks.distributed:  # the epoch's loss and throughput over every rank's pieces; timings stay this rank's
            totals = self.peers.sum(torch.tensor([total_loss, pairs, positives], dtype=torch.float64))
            total_loss, pairs, positives = float(totals[0]), int(totals[1]), int(totals[2])
        record = LinkEpochRecord(epoch=epoch, loss=total_loss / max(1, pairs), batches=batches, samples=positives,
                                 samples_per_s=positives / train_s if train_s > 0 else 0.0, wait_s=wait_s,
                                 step_s=step_s, data_wait=wait_s / busy if busy > 0 else 0.0, train_s=train_s)
        if self.source.buffer is not None:  # what the epoch's buffer plan would read out of core
            plan = self.source.buffer_epoch(epoch).plan
            record.buffer_states, record.partition_loads = plan.num_states, plan.io_partitions
        return record

    def _step(self, batch: LinkBatch, waiting: float) -> tuple[float, int, float, float]:
        """One optimizer step on ``batch`` (on the device): (its summed loss, its pairs, the seconds waited for it
        since ``waiting``, the step's seconds)."""
        waited = time.perf_counter() - waiting
        step_started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        graph = batch.graph
        logits = self.train_model(graph.x, graph.edge_index, graph.num_sampled_nodes, graph.num_sampled_edges,
                                  batch.edge_label_index)
        labelled = int(batch.edge_label.numel())
        summed: torch.Tensor | None = None
        if batch.global_positives is None:
            loss = F.binary_cross_entropy_with_logits(logits, batch.edge_label, weight=batch.edge_weight)
        else:
            # a piece's summed loss times W over the global batch's pairs: DDP divides the ranks' sum by W
            summed = F.binary_cross_entropy_with_logits(logits, batch.edge_label, weight=batch.edge_weight,
                                                        reduction="sum")
            pairs_global = batch.global_positives * (1 + self.source.negatives)
            loss = summed * (self.ranks.world_size / max(1, pairs_global))
        loss.backward()
        self.optimizer.step()
        if self.averaged is not None:
            self.averaged.update_parameters(self.model)
        # .item() also waits for the GPU: the step's time is whole
        summed_loss = summed.item() if summed is not None else loss.item() * labelled
        return summed_loss, labelled, waited, time.perf_counter() - step_started

    @property
    def evaluated_model(self) -> LinkModel:
        """What evaluation runs and the run returns: the weights' moving average, or the weights."""
        return self.model if self.averaged is None else cast(LinkModel, self.averaged.module)

    @torch.no_grad()
    def evaluate(self, split: str) -> dict[str, float]:
        """Every ``LINK_METRICS`` score of ``split``: embed its nodes, score each positive and its negatives."""
        model = self.evaluated_model
        model.eval()
        hidden = self.cfg.train.hidden
        parts: list[torch.Tensor] = []
        for host in self.source.eval_batches(split):
            try:
                batch = host.to(self.device)
                parts.append(model.embed(batch.x, batch.edge_index, batch.num_sampled_nodes,
                                              batch.num_sampled_edges))
            finally:
                host.release()  # the embedding is the model's own tensor: the slot's views are read
        # the split's nodes and pairs: known up front in memory, once its stream has ended from the daemon
        held = self.source.held_out[split]
        embeddings = torch.cat(parts) if parts else torch.empty((0, hidden), dtype=torch.float32, device=self.device)
        row = embeddings.shape[0]
        if row != len(held.nodes):
            raise RuntimeError(f"{split} evaluation embedded {row} nodes, expected {len(held.nodes)}")
        src = torch.from_numpy(held.src).to(self.device)
        dst = torch.from_numpy(held.dst).to(self.device)
        tails = torch.from_numpy(held.tails).to(self.device)
        pos = model.decode(embeddings[src], embeddings[dst])
        k = tails.shape[1]
        neg = torch.empty((len(src), k), dtype=torch.float32, device=self.device)
        rows = max(1, EVAL_PAIR_CELLS // max(1, k * hidden))
        for start in range(0, len(src), rows):
            h_src = embeddings[src[start:start + rows]].unsqueeze(1)  # (r, 1, hidden): broadcast over the K tails
            neg[start:start + rows] = model.decode(h_src, embeddings[tails[start:start + rows]])
        return link_scores(pos.cpu().numpy(), neg.cpu().numpy())

    def run_epoch(self, epoch: int) -> bool:
        """Train, maybe evaluate, record, checkpoint; True when the run stops after this epoch."""
        train = self.cfg.train
        record = self.train_epoch(epoch)
        if self.result.stopped_on_request:
            self.log(f"stop requested: epoch {epoch} cut after {record.batches} steps; not evaluated, "
                     f"recorded or checkpointed")
            return True
        cut = self.result.stopped_at_max_steps
        if not cut and (epoch % train.eval_every == 0 or epoch == train.epochs):
            started = time.perf_counter()
            record.val = self.evaluate("val")
            record.val_score = record.val[self.metric]
            best = self.result.best_val_score
            # NaN (an undefined score) is never an improvement: it compares false either way
            if not math.isnan(record.val_score) and (best is None or record.val_score > best):
                record.test = self.evaluate("test")
                record.test_score = record.test[self.metric]
                result = self.result
                result.best_epoch, result.best_val_score, result.test_score_at_best = (epoch, record.val_score,
                                                                                       record.test_score)
                result.best_val, result.test_at_best = record.val, record.test
                self.bad_evals = 0
            else:
                self.bad_evals += 1
            record.eval_s = time.perf_counter() - started
        self.result.epochs.append(record)
        stop = train.patience is not None and self.bad_evals >= train.patience and epoch < train.epochs
        self.result.stopped_early = stop
        if self.metrics is not None:
            scores = {split: values for split, values in (("val", record.val), ("test", record.test))
                      if values is not None}
            self.metrics.observe_link_epoch(epoch, record.loss, record.samples_per_s, record.data_wait, scores)
        self.log(format_link_epoch(record, train.epochs, self.metric))
        if train.checkpoint is not None:
            self.save(epoch)
        return stop or cut

    def save(self, epoch: int) -> None:
        path = self.cfg.train.checkpoint
        assert path is not None
        if not self.ranks.main:  # the weights are every rank's; rank 0 writes them
            return
        self.control.writing = epoch
        result = self.result
        progress = {"best_epoch": result.best_epoch, "best_val": result.best_val_score,
                    "best_test": result.test_score_at_best, "best_val_scores": result.best_val,
                    "test_at_best": result.test_at_best, "bad_evals": self.bad_evals,
                    "stopped_early": result.stopped_early, "metric_reason": result.metric_reason}
        save_checkpoint(path, Checkpoint(
            epoch=epoch, model_state=self.model.state_dict(), optimizer_state=self.optimizer.state_dict(),
            signature=self.signature, config=self.cfg.to_json(), progress=progress,
            history=[asdict(record) for record in result.epochs], rng=capture_rng(), metric=self.metric,
            task="link", averaged_state=None if self.averaged is None else self.averaged.state_dict(),
            code=result.code))
        self.control.checkpoint_epoch, self.control.writing = epoch, None


def train_link(source: LinkSource, cfg: LinkConfig, *, progress: bool = False,
               progress_interval: float = DEFAULT_INTERVAL_S, metrics: TrainerMetrics | None = None,
               log: Callable[[str], None] | None = None, control: StopControl | None = None,
               ranks: Ranks = SINGLE) -> LinkResult:
    """Train a link predictor on ``source`` for ``cfg.train.epochs`` epochs (fewer when early stopping fires).

    ``progress``, ``progress_interval``, ``metrics``, ``log``, ``control`` and ``ranks`` as ``trainer.loop.train``'s
    (under several ranks the process group is set up and ``source`` yields this rank's pieces);
    ``result.model`` is the trained ``LinkModel``.
    """
    control = control if control is not None else StopControl()
    run = _LinkRun(source, cfg, progress, progress_interval, metrics, log if log is not None else log_.info,
                   control, ranks)
    if cfg.train.resume:
        run.resume()
        if run.result.stopped_early:
            run.log(f"the checkpointed run had stopped early after epoch {run.next_epoch - 1}; nothing to do")
            run.result.model = run.evaluated_model
            return run.result
    for epoch in range(run.next_epoch, cfg.train.epochs + 1):
        if run.peers.any(control.requested):
            run.result.stopped_on_request = True
            break
        if run.run_epoch(epoch):
            break
    run.result.model = run.evaluated_model
    return run.result
