"""``megabatch train`` (``python -m trainer``): train a GNN from the loader daemon or in memory.

User errors (missing dataset, bad values, incompatible checkpoint) print one line and exit 1;
usage errors exit 2; an unexpected exception prints one line (``--debug`` shows the traceback) and
exits 70.

Stopping: SIGTERM (``systemctl stop``) finishes the current step, stops, prints one line saying which
checkpoint the file holds (checkpoints are written at epoch boundaries only: the cut epoch is replayed
whole by ``--resume``) and exits 0; a trainer queued behind another for the daemon's training pipeline
has no step to finish and stops at once. A second SIGTERM interrupts at once and exits 130, as Ctrl-C
(SIGINT) does; its line says what the checkpoint holds too.

Several ranks (DDP): under torchrun (WORLD_SIZE > 1 in the environment) each process is one rank;
``--nproc-per-node N`` starts N ranks on this machine itself (``trainer.launch``). With ``--socket`` every
rank joins one job on its machine's daemon, which deals each epoch to the job's ranks.
Rank 0 alone prints epoch lines and the final line, serves ``--metrics-port``, writes ``--json-out``
and the checkpoint; every rank prints its own error lines, prefixed with "rank R/W".

Metrics (``trainer.scrape``): after training, rank 0 keeps serving them ``--metrics-linger`` seconds so
that Prometheus scrapes the last epoch; a signal ends that wait and the run exits 0 (training was done).
Log lines are stamped with time and level outside journald (``proto.logs``); progress is a bar on a
terminal and periodic log lines elsewhere (``trainer.progress``).
"""

import argparse
import atexit
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from proto.atomic import atomic_file, io_error
from proto.cli_types import non_negative_int, non_negative_seconds, parse_fanouts, positive_int, positive_seconds
from proto.errors import UserError
from proto.logs import configure_logging, error_line
from proto.sizes import format_size, parse_size
from trainer.allocator import keep_freed_memory
from trainer.link.options import ALL_METRIC_CHOICES, DEFAULT_BUFFER_LR, DEFAULT_LINK_LR
from trainer.link.options import add_arguments as add_link_arguments
from trainer.link.options import check_arguments as check_link_arguments
from trainer.ranks import DEFAULT_TIMEOUT_S, Ranks, ranks_from_env
from trainer.scores import MINORITY_SHARE
from trainer.scrape import add_arguments as add_metrics_arguments
from trainer.scrape import check_arguments as check_metrics_arguments

__all__ = ["main", "exit_program", "build_parser", "parse_fanouts", "SamplerSettings", "resolve_sampler",
           "checkpoint_note", "write_json", "epoch_printer", "report_result"]

if TYPE_CHECKING:
    from trainer.loop import StopControl
    from trainer.metrics import TrainerMetrics

PROG = "megabatch train"
AUTO = "auto"
"""``--micro-batches auto``: the fewest micro-batches that fit the CUDA device's free memory."""
log = logging.getLogger("megabatch")

_SAMPLER_DEFAULTS: dict[str, Any] = {"batch_size": 1024, "fanouts": (10, 5), "eval_fanouts": None,
                                     "eval_batch_size": 1024, "seed": 0}


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (``--help`` still prints the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def _cache_size(text: str) -> int:
    """``--feature-cache``: a size like 256M, or 0 (off)."""
    if text.strip() == "0":
        return 0
    try:
        return parse_size(text, name="--feature-cache")
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--feature-cache: ")) from None


def _device_memory(text: str) -> int:
    """``--device-memory``: a size like 8G."""
    try:
        return parse_size(text, name="--device-memory")
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--device-memory: ")) from None


def _micro_batches(text: str) -> int | str:
    """``--micro-batches``: a positive count, or "auto"."""
    return AUTO if text == AUTO else positive_int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Train a GNN on batches from the loader daemon (--socket) or from a "
                                            "dataset held in memory (--mode inmemory --dataset).")
    src = parser.add_argument_group("batch source")
    src.add_argument("--socket", help="loader daemon's control socket (daemon mode)")
    src.add_argument("--connect-timeout", type=non_negative_seconds, default=0.0,
                     help="seconds to wait for the daemon's socket to appear (default 0: fail at once)")
    src.add_argument("--feature-cache", type=_cache_size, default=0, metavar="SIZE",
                     help="keep this many bytes of feature rows on the training device (GPU memory, else RAM), "
                          "planned by the daemon so that only the rows it lacks are shipped, e.g. 256M "
                          "(default 0: off; daemon mode only)")
    src.add_argument("--aggregation-cache", action="store_true",
                     help="read the dataset's aggregation cache (megabatch aggregate): batches sample one hop fewer "
                          "and the first layer takes every node's features aggregated over all its neighbours "
                          "(BatchGNN; --model sage with a mean cache, gcn with a gcn cache; inmemory mode: through a "
                          "daemon, its [sampler] aggregation_cache decides, and the trainer follows)")
    src.add_argument("--no-eval-aggregation", dest="eval_aggregation", action="store_false",
                     help="with --aggregation-cache, evaluate on batches that sample every hop instead (inmemory mode; "
                          "a daemon's [sampler] eval_aggregation)")
    src.add_argument("--no-pin-slots", dest="pin_slots", action="store_false",
                     help="with --device cuda, do not register the daemon's slots as pinned host memory: copies to "
                          "the GPU are then synchronous, through the driver's bounce buffer (default: pinned)")
    src.add_argument("--mode", choices=("daemon", "inmemory"), default=None,
                     help="daemon (default with --socket) or inmemory (the in-memory reference)")
    src.add_argument("--dataset", help="prepared dataset directory (inmemory mode; default: [dataset] of --config)")
    src.add_argument("--config", help="loader TOML config: its [sampler] (and [dataset]) apply in inmemory mode")
    src.add_argument("--batch-size", type=positive_int,
                     help="training seeds (--task link: positive edges) per batch (default 1024)")
    src.add_argument("--fanouts", type=parse_fanouts, help="neighbours per hop, -1 = all (default 10,5)")
    src.add_argument("--eval-fanouts", type=parse_fanouts, help="fanouts of val/test batches (default: --fanouts)")
    src.add_argument("--eval-batch-size", type=positive_int, help="seeds per evaluation batch (default 1024)")
    src.add_argument("--sampler-seed", type=non_negative_int, help="sampling and shuffle seed (default 0)")

    mod = parser.add_argument_group("model and training")
    mod.add_argument("--model", choices=("sage", "gcn", "gat"), default="sage", help="(default sage)")
    mod.add_argument("--hidden", type=positive_int, default=256, help="hidden width (default 256)")
    mod.add_argument("--heads", type=positive_int, default=4, help="gat attention heads (default 4)")
    mod.add_argument("--dropout", type=float, default=0.5, help="(default 0.5)")
    mod.add_argument("--lr", type=float, default=None,
                     help=f"Adam learning rate (default 0.003; --task link {DEFAULT_LINK_LR}, in a partition buffer "
                          f"order {DEFAULT_BUFFER_LR}: --link-order comet|beta, or a daemon's hierarchical mode)")
    mod.add_argument("--weight-decay", type=float, default=0.0, help="(default 0)")
    mod.add_argument("--epochs", type=positive_int, default=10, help="(default 10)")
    mod.add_argument("--eval-every", type=positive_int, default=1, help="evaluate every N epochs (default 1)")
    mod.add_argument("--patience", type=positive_int, default=None,
                     help="stop after N evaluations without a better val score by --metric (default: never)")
    mod.add_argument("--metric", choices=ALL_METRIC_CHOICES, default="auto",
                     help="what picks the best epoch and drives --patience; accuracy is reported either way. "
                          f"auto: roc_auc for a binary task whose minority class is under "
                          f"{100 * MINORITY_SHARE:.0f}%% of the labelled training nodes, else accuracy. "
                          "roc_auc on more than two classes is the one-vs-rest macro average; macro_f1 the mean "
                          "F1 over the classes present. --task link: auto is mrr; mrr, hits@1, hits@10, hits@50 "
                          "and roc_auc rank held-out edges against their negatives (default auto)")
    mod.add_argument("--max-steps", type=positive_int, default=None,
                     help="stop after N optimizer steps in all, mid-epoch if need be, without evaluating "
                          "the cut epoch (benchmarks; default: no limit)")
    mod.add_argument("--seed", type=non_negative_int, default=0, help="model and dropout seed (default 0)")
    mod.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="(default auto)")
    micro = mod.add_mutually_exclusive_group()
    micro.add_argument("--micro-batches", type=_micro_batches, default=None, metavar="K|auto",
                       help="train every batch as K micro-batches whose gradients accumulate to the batch's (one "
                            "optimizer step per batch; seeds grouped by METIS on shared neighbours, Betty's REG); "
                            "auto: the fewest that fit the CUDA device's free memory (--device-memory of it)")
    micro.add_argument("--device-memory", type=_device_memory, default=None, metavar="SIZE",
                       help="split each batch into the fewest micro-batches whose estimated peak (batch, "
                            "activations, model and Adam state) fits SIZE of device memory, e.g. 8G (default: "
                            "train whole batches)")
    mod.add_argument("--checkpoint", help="write a checkpoint here after every epoch")
    mod.add_argument("--resume", action="store_true", help="continue from --checkpoint")

    add_link_arguments(parser)

    dist = parser.add_argument_group("several ranks (DDP)")
    dist.add_argument("--nproc-per-node", type=positive_int, default=1, metavar="N",
                      help="train with N ranks on this machine (gloo on CPU, NCCL with one GPU per rank), started "
                           "by this command; under torchrun leave it out: torchrun sets the ranks (default 1)")
    dist.add_argument("--dist-timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                      help="longest a rank waits for the others (startup, each step, a checkpoint, an evaluation) "
                           f"before it fails instead of hanging on a dead rank (default {DEFAULT_TIMEOUT_S:g})")

    out = parser.add_argument_group("output")
    add_metrics_arguments(out)
    out.add_argument("--json-out", help="write the result (per-epoch records, best epoch) as JSON here")
    out.add_argument("--no-progress", dest="progress", action="store_false",
                     help="no progress bar (on a terminal) or progress lines (elsewhere)")
    out.add_argument("--progress-interval", type=non_negative_seconds, default=10.0, metavar="SECONDS",
                     help="seconds between progress lines when stderr is not a terminal (0: every step; default 10)")
    out.add_argument("-q", "--quiet", action="store_true", help="only the final line, warnings and errors")
    out.add_argument("--debug", action="store_true", help="show tracebacks for unexpected errors")
    return parser


@dataclass(frozen=True)
class SamplerSettings:
    """Resolved in-memory sampler options: a flag beats the config's [sampler], which beats the default.

    batch_size (default 1024), fanouts (default (10, 5)), eval_fanouts (default None: ``fanouts``),
    eval_batch_size (default 1024), seed (default 0).
    """

    batch_size: int
    fanouts: tuple[int, ...]
    eval_fanouts: tuple[int, ...] | None
    eval_batch_size: int
    seed: int


def resolve_sampler(args: argparse.Namespace) -> tuple[SamplerSettings, Path | None]:
    """The sampler settings and the dataset path for inmemory mode (from flags, then --config)."""
    values = dict(_SAMPLER_DEFAULTS)
    dataset = Path(args.dataset) if args.dataset else None
    if args.config:
        from loader.daemon.config import load_config

        config = load_config(args.config)
        values.update(batch_size=config.sampler.batch_size, fanouts=config.sampler.fanouts,
                      eval_fanouts=config.sampler.eval_fanouts, eval_batch_size=config.sampler.eval_batch_size,
                      seed=config.sampler.seed)
        dataset = dataset or config.dataset.path
    flags = {"batch_size": args.batch_size, "fanouts": args.fanouts, "eval_fanouts": args.eval_fanouts,
             "eval_batch_size": args.eval_batch_size, "seed": args.sampler_seed}
    values.update({key: value for key, value in flags.items() if value is not None})
    if args.fanouts is not None and args.eval_fanouts is None:
        values["eval_fanouts"] = None  # --fanouts alone: evaluate with the same fanouts
    return SamplerSettings(**values), dataset


def write_json(path: Path, data: dict[str, Any]) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"--json-out: directory {parent} does not exist")
    try:
        with atomic_file(path, "w") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
    except OSError as err:
        raise io_error(err, f"writing {path}") from err


class _StoppedWhileQueued(BaseException):
    """SIGTERM while the daemon queued this trainer: no step is under way, so the run ends at once (exit 0).
    Not an ``Exception``: nothing on the way out may take it for a failure and handle it."""


class _SigtermStop:
    """The SIGTERM handler: the first signal asks the run to stop at the next step boundary, a second
    one interrupts at once (``KeyboardInterrupt``). While the daemon queues the run (``queued``) there is
    no step boundary to wait for: the first signal ends the wait at once (``_StoppedWhileQueued``). It
    exists before torch is imported; ``attach`` hands it the run's ``StopControl`` once there is one."""

    def __init__(self) -> None:
        self.requested = False
        self.waiting = False
        self.control: StopControl | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.control is not None:
            self.control.requested = True
        if self.waiting:
            raise _StoppedWhileQueued
        log.warning("SIGTERM: stopping after the current step (send it again to stop at once)")

    def queued(self, waiting: bool) -> None:
        """``DaemonSource``'s ``on_queued``. A stop asked for between the epoch's start and the daemon's
        ``Queued`` would otherwise wait for the whole queue."""
        self.waiting = waiting
        if waiting and self.requested:
            raise _StoppedWhileQueued

    def attach(self, control: "StopControl") -> None:
        control.requested = self.requested
        self.control = control


def checkpoint_note(checkpoint: str | None, control: "StopControl | None") -> str:
    """What the ``--checkpoint`` file holds now, as far as this run knows (never more than it wrote);
    ``control`` None: the run never started."""
    if not checkpoint:
        return "no checkpoint was written (no --checkpoint)"
    if control is None:
        return "no checkpoint was written (training had not started)"
    if control.writing is not None:
        before = f"epoch {control.checkpoint_epoch}" if control.checkpoint_epoch is not None else "what it held before"
        return (f"the checkpoint {checkpoint} was being written for epoch {control.writing}: it holds that epoch or "
                f"{before}; resume with --resume")
    if control.checkpoint_epoch is None:
        return "no checkpoint was written (no epoch completed)"
    return f"the checkpoint {checkpoint} holds epoch {control.checkpoint_epoch}; resume with --resume"


class _RunResult(Protocol):
    """What ``report_result`` reads of a node or link run's result."""

    stopped_on_request: bool

    def to_json(self) -> dict[str, Any]: ...

    def summary(self) -> str: ...


def epoch_printer(args: argparse.Namespace) -> Callable[[str], None]:
    """The loop's per-epoch line: printed, or dropped with ``-q``."""
    return (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))


def report_result(args: argparse.Namespace, result: _RunResult, finished: str, control: "StopControl",
                  metrics: "TrainerMetrics | None", stop: _SigtermStop) -> int:
    """Rank 0's end of a run, node or link: ``--json-out``, the stop note or the summary and the ``finished``
    line, then the metrics' linger; the exit status."""
    if args.json_out:
        write_json(Path(args.json_out), result.to_json())
    if result.stopped_on_request:
        print(f"{PROG}: stopped; {checkpoint_note(args.checkpoint, control)}", flush=True)
        return 0
    print(result.summary(), flush=True)
    log.info("%s", finished)
    if metrics is not None:
        from trainer.scrape import linger_after_training

        # a SIGTERM already taken (by the handler that stops training) means: no wait
        linger_after_training(metrics, args.metrics_linger, skip=lambda: stop.requested)
    return 0


SEVERAL_RANKS_NO_CACHE = ("--feature-cache: not with several ranks (the daemon deals one stream to all of a job's "
                          "ranks and plans no client cache for it)")


def _run(args: argparse.Namespace, argv: Sequence[str], ranks: Ranks, stop: _SigtermStop) -> int:
    if ranks.distributed and args.feature_cache:
        raise UserError(SEVERAL_RANKS_NO_CACHE)
    if ranks.distributed and args.nproc_per_node > 1:
        raise UserError(f"--nproc-per-node {args.nproc_per_node}: this process is already one of "
                        f"{ranks.world_size} ranks (WORLD_SIZE is set, as torchrun sets it); use one or the other")
    # the dataset and config are checked before torch is imported: their errors come in a blink
    opened = None
    if args.mode == "daemon" and args.task == "link":
        from trainer.link.run import run_link

        return run_link(args, None, None, ranks, stop, argv)
    if args.mode == "inmemory":
        from loader.format.dataset import open_dataset

        sampler, dataset = resolve_sampler(args)
        if dataset is None:
            raise UserError("--mode inmemory needs --dataset PATH (or a --config with a [dataset] path)")
        opened = open_dataset(dataset)
        if args.task == "link":
            from trainer.link.run import run_link

            return run_link(args, opened, sampler, ranks, stop, argv)

    from trainer.loop import StopControl, TrainConfig, resolve_device, train
    from trainer.metrics import TrainerMetrics
    from trainer.micro_batches import free_device_memory
    from trainer.progress import finished_line
    from trainer.scrape import served
    from trainer.source import BatchSource

    micro_auto = args.micro_batches == AUTO
    if micro_auto and args.device == "cpu":
        raise UserError("--micro-batches auto sizes micro-batches to a CUDA device's free memory; on the CPU give "
                        "--device-memory SIZE or --micro-batches K")
    cfg = TrainConfig(model=args.model, hidden=args.hidden, dropout=args.dropout,
                      lr=TrainConfig.lr if args.lr is None else args.lr, weight_decay=args.weight_decay,
                      epochs=args.epochs, eval_every=args.eval_every,
                      patience=args.patience, seed=args.seed, device=args.device,
                      checkpoint=Path(args.checkpoint) if args.checkpoint else None, resume=args.resume,
                      heads=args.heads, max_steps=args.max_steps, metric=args.metric,
                      micro_batches=None if micro_auto else args.micro_batches, device_memory=args.device_memory)
    if args.nproc_per_node > 1:
        # the arguments, the dataset and the configuration were checked once, here, before any rank starts
        from trainer.launch import launch

        return launch(argv, args.nproc_per_node)
    device = resolve_device(cfg.device, ranks)
    if micro_auto:  # each rank sizes its own device
        cfg = dataclasses.replace(cfg, device_memory=free_device_memory(device))
        log.info("--micro-batches auto: %s of %s's free memory per step", format_size(cfg.device_memory or 0),
                 device)
    source: BatchSource
    if opened is None:
        try:
            from trainer.daemon_source import DaemonSource
        except ImportError as err:
            raise UserError(f"daemon mode is not available in this installation ({err})") from None
        source = DaemonSource(args.socket, connect_timeout=args.connect_timeout,
                              feature_cache_bytes=args.feature_cache, ranks=ranks, on_queued=stop.queued,
                              pin_slots=args.pin_slots, micro_batches=cfg.micro_batches or 0)
        if args.feature_cache and not source.info.feature_cache_rows:
            log.warning("--feature-cache %s: the daemon plans no feature cache (an older daemon, or less than "
                        "one feature row); every row is shipped", args.feature_cache)
    else:
        from trainer.inmemory_source import InMemorySource

        source = InMemorySource(opened, batch_size=sampler.batch_size, fanouts=sampler.fanouts,
                                eval_fanouts=sampler.eval_fanouts, eval_batch_size=sampler.eval_batch_size,
                                seed=sampler.seed, rank=ranks.rank, world_size=ranks.world_size,
                                aggregation=args.aggregation_cache, eval_aggregation=args.eval_aggregation,
                                # rows held sparse feed layer 0's CPU product; micro-batches index dense rows
                                hold_sparse=(device.type == "cpu" and not cfg.micro_batches
                                             and cfg.device_memory is None and not args.aggregation_cache))
    # one set of metrics per job, rank 0's: the ranks would fight over one --metrics-port
    metrics = TrainerMetrics() if ranks.main else None
    control = StopControl()
    stop.attach(control)
    with contextlib.ExitStack() as exposed:
        try:
            if metrics is not None:
                exposed.enter_context(served(metrics, args))
            info = source.info
            log.info("source: %s (%d features, %d classes, %d hops, %d training nodes)", info.description,
                     info.num_features, info.num_classes, info.num_hops, info.train_nodes)
            if ranks.distributed:
                import torch

                from trainer.distributed import process_group

                log.info("%d ranks (%s), %d seeds per rank and step, %d threads per rank; --dist-timeout %g s",
                         ranks.world_size, "nccl" if device.type == "cuda" else "gloo", info.batch_size,
                         torch.get_num_threads(), args.dist_timeout)
            with contextlib.ExitStack() as group:
                if ranks.distributed:
                    group.enter_context(process_group(ranks, device, args.dist_timeout))
                result = train(source, cfg, progress=args.progress, progress_interval=args.progress_interval,
                               metrics=metrics, control=control, ranks=ranks, log=epoch_printer(args))
        finally:
            source.close()  # before lingering: the daemon's session and slots are not the metrics' to hold
        if not ranks.main:
            return 0
        return report_result(args, result, finished_line(result), control, metrics, stop)


def _check_mode(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.mode is None:
        if args.socket is None:
            parser.error("give --socket PATH (daemon mode) or --mode inmemory --dataset PATH")
        args.mode = "daemon"
    check_link_arguments(args, parser.error)
    if args.mode == "daemon":
        if args.socket is None:
            parser.error("--mode daemon needs --socket PATH")
        given = [flag for flag, value in (("--dataset", args.dataset), ("--config", args.config),
                                          ("--batch-size", args.batch_size), ("--fanouts", args.fanouts),
                                          ("--eval-fanouts", args.eval_fanouts),
                                          ("--eval-batch-size", args.eval_batch_size),
                                          ("--sampler-seed", args.sampler_seed)) if value is not None]
        if given:
            parser.error(f"{', '.join(given)}: inmemory-mode options (the daemon's config sets its sampler)")
        if args.nproc_per_node > 1 and args.feature_cache:
            parser.error(SEVERAL_RANKS_NO_CACHE)
        if args.aggregation_cache or not args.eval_aggregation:
            flag = "--aggregation-cache" if args.aggregation_cache else "--no-eval-aggregation"
            parser.error(f"{flag}: inmemory-mode option (a daemon serves x_agg where its config sets [sampler] "
                         "aggregation_cache = true, and the trainer follows)")
    elif args.socket is not None:
        parser.error("--socket and --mode inmemory exclude each other")
    elif args.feature_cache:
        # the in-memory reference holds every feature row in the trainer already: nothing to ship or cache
        parser.error("--feature-cache: daemon mode only (--mode inmemory holds every feature row in memory)")
    elif args.dataset is None and args.config is None:
        parser.error("--mode inmemory needs --dataset PATH (or a --config with a [dataset] path)")
    if args.resume and not args.checkpoint:
        parser.error("--resume needs --checkpoint PATH")
    check_metrics_arguments(args, parser.error)


def _peer_failure(err: BaseException, ranks: Ranks, timeout_s: float) -> str | None:
    if not ranks.distributed:
        return None
    from trainer.distributed import peer_failure

    return peer_failure(err, ranks, timeout_s)


def _data_path_errors() -> tuple[type[Exception], ...]:
    """Failures of the batch stream (daemon gone, batches lost): reported in one line, not as a bug."""
    from trainer.daemon_source import DaemonError
    from trainer.loop import SequenceError

    errors: list[type[Exception]] = [SequenceError, DaemonError]
    return tuple(errors)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_mode(parser, args)
    keep_freed_memory()  # before the first batch: wide features otherwise cost a kernel page fault per 4 KiB a step
    try:
        ranks = ranks_from_env()
    except UserError as err:
        print(error_line(f"{PROG}: error: {err}"), file=sys.stderr)
        return 1
    if not ranks.main:
        args.quiet = True  # one log per job, rank 0's; errors and warnings still come from every rank
    # stamped: outside journald nothing else records when a line was written, or at which level
    configure_logging(logging.WARNING if args.quiet else logging.INFO, stamped=True)
    if args.quiet:
        args.progress = False
    stop = _SigtermStop()
    _STOPS.append(stop)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return _run(args, argv, ranks, stop)
    except (Exception, KeyboardInterrupt, _StoppedWhileQueued) as err:
        if ranks.distributed:
            _FAILED.append(err)  # its traceback holds the run, DDP's reducer and the process group: see exit_program
        return _report(err, args, ranks, stop.control)
    finally:
        signal.signal(signal.SIGTERM, previous)


_STOPS: list[_SigtermStop] = []
"""Each ``main`` call's SIGTERM handler: ``exit_program`` asks the last one whether a SIGTERM came already."""

_FAILED: list[BaseException] = []
"""Under several ranks, the error that ended the run, kept (with everything its traceback holds) until
``exit_program`` leaves with ``os._exit``."""


def _report(err: BaseException, args: argparse.Namespace, ranks: Ranks, control: "StopControl | None") -> int:
    """Print the one line for ``err``; the exit status."""
    who = f"{ranks.label()}: " if ranks.distributed else ""
    if isinstance(err, _StoppedWhileQueued):
        print(f"{PROG}: {who}stopped while queued for the loader daemon's training pipeline; "
              f"{checkpoint_note(args.checkpoint, control)}", flush=True)
        return 0
    if isinstance(err, UserError):
        print(error_line(f"{PROG}: error: {who}{err}"), file=sys.stderr)
        return 1
    if isinstance(err, KeyboardInterrupt):
        print(f"{PROG}: {who}interrupted; {checkpoint_note(args.checkpoint, control)}", file=sys.stderr)
        return 130
    if isinstance(err, OSError):
        print(error_line(f"{PROG}: error: {who}{io_error(err, 'training')}"), file=sys.stderr)
        return 1
    # the user interface is never a traceback
    lost = _peer_failure(err, ranks, args.dist_timeout)
    if lost is not None or isinstance(err, _data_path_errors()):
        # the data path or a peer rank broke: what can be resumed is the next question
        print(error_line(f"{PROG}: error: {who}{lost or err}; {checkpoint_note(args.checkpoint, control)}"),
              file=sys.stderr)
        return 1
    if args.debug:
        traceback.print_exception(err)
    print(error_line(f"{PROG}: internal error: {who}{type(err).__name__}: {err} (rerun with --debug for "
                     "details)"), file=sys.stderr)
    return 70


def exit_program(code: int) -> NoReturn:
    """End the ``megabatch train`` process with ``code``, with ``os._exit`` once its output is flushed.

    One process runs its exit handlers first. The interpreter's own teardown is skipped: after torch and
    PyG it takes seconds, and it hands every signal back to its default action first, so a second
    SIGTERM then (systemd's, a user's) killed the process with 143 instead of the documented 130. Until
    the process is gone a SIGTERM or Ctrl-C ends it at once: 130 for a Ctrl-C or a second SIGTERM, else
    ``code`` (the run is over: a first SIGTERM has nothing left to stop).

    A rank of several runs no exit handler and frees nothing a failed run left (``_FAILED``). After a
    failed collective, freeing DDP's reducer frees the process group, whose destructor joins gloo's
    worker threads while holding the GIL, and a worker still finishing the failed collective waits for
    the GIL to release its tensors: a deadlock (seen with gdb, now and then, in a rank whose peer had
    been killed), which is the very hang ``--dist-timeout`` is there to prevent. Nothing is lost: the
    JSON result and the checkpoint are written atomically before this, the metrics server is closed,
    and no rank relies on an exit handler.
    """
    try:
        several = ranks_from_env().distributed
    except UserError:
        several = False  # main reported it already
    stopped = bool(_STOPS) and _STOPS[-1].requested

    def at_once(signum: int, frame: object) -> None:
        _flush_and_exit(130 if stopped or signum == signal.SIGINT else code)

    signal.signal(signal.SIGTERM, at_once)
    signal.signal(signal.SIGINT, at_once)
    if not several:
        atexit._run_exitfuncs()
    logging.shutdown()
    _flush_and_exit(code)


def _flush_and_exit(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe must not turn the exit into a traceback
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_program(main())
