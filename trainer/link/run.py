"""``megabatch train --task link``: from the parsed flags and the opened dataset to the printed result.

``trainer.cli`` has checked the flags (``trainer.link.options``), opened the dataset and resolved the
sampler settings; what follows mirrors its node path (metrics port, stop handling, ``--json-out``, the
final line), with the link source, loop and result.
"""

import argparse
import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.ranks import Ranks

if TYPE_CHECKING:  # the dataset is opened by trainer.cli's in-memory path; here it is only a type
    from loader.format.dataset import Dataset
    from trainer.cli import SamplerSettings, _SigtermStop

__all__ = ["run_link"]

log = logging.getLogger("megabatch")


def run_link(args: argparse.Namespace, dataset: "Dataset | None", sampler: "SamplerSettings | None", ranks: Ranks,
             stop: "_SigtermStop", argv: Sequence[str] = ()) -> int:
    """Train, print the epoch lines and the final line, write ``--json-out``; the exit status. With
    ``--nproc-per-node N`` (> 1) this process launches the N ranks (``argv``: the command line) instead.
    ``dataset`` None: the batches come from the daemon at ``args.socket`` (``sampler`` unused)."""
    if args.nproc_per_node > 1:
        from trainer.launch import launch

        return launch(argv, args.nproc_per_node)
    import torch

    from trainer.cli import epoch_printer, report_result
    from trainer.distributed import process_group, training_device
    from trainer.link.inmemory import LinkInMemorySource
    from trainer.link.loop import train_link
    from trainer.link.options import DEFAULT_EMA, default_lr
    from trainer.link.records import LinkConfig
    from trainer.link.source import LinkSource
    from trainer.metrics import TrainerMetrics
    from trainer.records import StopControl, TrainConfig
    from trainer.scrape import served

    # the order the training edges follow, which sets the default lr: --link-order in memory, the daemon's through one
    order = args.link_order or "shuffled"
    train = TrainConfig(model=args.model, hidden=args.hidden, dropout=args.dropout,
                        lr=default_lr(order) if args.lr is None else args.lr,
                        weight_decay=args.weight_decay, epochs=args.epochs, eval_every=args.eval_every,
                        patience=args.patience, seed=args.seed, device=args.device,
                        checkpoint=Path(args.checkpoint) if args.checkpoint else None, resume=args.resume,
                        heads=args.heads, max_steps=args.max_steps)
    source: LinkSource
    if dataset is None:  # the daemon's: its [link] config sets the negatives and disjoint, as [sampler] the batches
        from trainer.link.daemon_source import LinkDaemonSource

        daemon = LinkDaemonSource(args.socket, connect_timeout=args.connect_timeout, on_queued=stop.queued,
                                  ranks=ranks)
        source = daemon
        negatives, disjoint, per_rank = daemon.negatives, daemon.disjoint, daemon.batch_size
        order = daemon.served_order
        if args.lr is None:  # a buffer order trains at its own default
            train = dataclasses.replace(train, lr=default_lr(order))
        # a buffer order's negative weights and COMET's edge assignment are the daemon's [link] config, which the
        # wire does not carry; the shuffled order has neither
        negative_weights: bool | None = False if order == "shuffled" else None
        assignment: str | None = None
    else:
        assert sampler is not None
        negatives, disjoint, per_rank = args.negatives or 1, bool(args.disjoint), sampler.batch_size
        negative_weights = order != "shuffled" and args.negative_weights is not False
        assignment = (args.link_assignment or "edge") if order == "comet" else None
    cfg = LinkConfig(train, decoder=args.decoder or "dot", negatives=negatives, disjoint=disjoint,
                     metric=args.metric, link_order=order,
                     buffer_partitions=args.buffer_partitions, logical_partitions=args.logical_partitions,
                     negative_weights=negative_weights, ema=DEFAULT_EMA if args.ema is None else args.ema,
                     assignment=assignment)
    if dataset is not None:
        assert sampler is not None
        source = LinkInMemorySource(dataset, batch_size=sampler.batch_size, negatives=cfg.negatives,
                                    disjoint=cfg.disjoint, fanouts=sampler.fanouts, eval_fanouts=sampler.eval_fanouts,
                                    eval_batch_size=sampler.eval_batch_size, seed=sampler.seed,
                                    link_order=cfg.link_order, buffer_partitions=cfg.buffer_partitions,
                                    logical_partitions=cfg.logical_partitions, rank=ranks.rank,
                                    world_size=ranks.world_size, negative_weights=bool(cfg.negative_weights),
                                    assignment=cfg.assignment or "edge")
    # one set of metrics per job, rank 0's: the ranks would fight over one --metrics-port
    metrics = TrainerMetrics() if ranks.main else None
    control = StopControl()
    stop.attach(control)
    with contextlib.ExitStack() as exposed:
        try:
            if metrics is not None:
                exposed.enter_context(served(metrics, args))
            log.info("source: %s (%d features, %d hops, %d training positives; %d val and %d test positives with %d "
                     "negatives each)", source.description, source.num_features, source.num_hops,
                     source.train_positives, source.positives("val"), source.positives("test"),
                     source.eval_negatives)
            if args.lr is None:  # which default applied depends on the order, so say it
                log.info("lr %g: link prediction's default in the %s order (--lr sets another)", train.lr, order)
            with contextlib.ExitStack() as group:
                if ranks.distributed:
                    group.enter_context(process_group(ranks, training_device(args.device, ranks), args.dist_timeout))
                    log.info("%d ranks, %d training positives per rank and step, %d threads per rank",
                             ranks.world_size, per_rank, torch.get_num_threads())
                result = train_link(source, cfg, progress=args.progress, progress_interval=args.progress_interval,
                                    metrics=metrics, control=control, ranks=ranks, log=epoch_printer(args))
        finally:
            source.close()  # before lingering: the daemon's session and slots are not the metrics' to hold
        if not ranks.main:
            return 0
        return report_result(args, result, result.finished_line(), control, metrics, stop)
