"""The ``megabatch`` command line: one entry point, one subcommand per tool.

User errors print one line and exit 1; ``serve`` exits ``EX_CONFIG`` (78) instead when its
configuration or dataset is unusable before it serves (systemd's ``RestartPreventExitStatus=78``
then stops the restart loop); Ctrl-C exits 130; argparse usage errors exit 2; an unexpected
exception prints one line (``--debug`` shows the traceback) and exits 70.

Log lines go to stderr as ``TIME LEVEL megabatch: message``; under journald (``JOURNAL_STREAM`` names
stderr, and journald stamps the time itself) each line starts with its syslog priority instead, ``<3>``
error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug (``proto.logs.JournalFormatter``), which journald strips
and records as the entry's priority. The one-line errors ``main`` prints are results, not log lines: unstamped.
"""

import argparse
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loader.memory import pin_malloc_thresholds
from proto.atomic import io_error
from proto.cli_types import parse_fanouts, positive_int, positive_seconds
from proto.errors import UserError
from proto.logs import configure_logging, error_line
from proto.sizes import parse_size

if TYPE_CHECKING:
    from loader.format.raw import RawDataset

__all__ = ["main", "build_parser", "EX_CONFIG"]

log = logging.getLogger("megabatch")

EX_CONFIG = 78
"""sysexits.h: configuration error. ``serve`` exits with it when the config or the dataset is unusable at
start-up (before serving): restarting cannot help, so the unit sets ``RestartPreventExitStatus=78``."""

class _ConfigError(Exception):
    """``serve`` could not start: its config or dataset is unusable (exit ``EX_CONFIG``)."""

    def __init__(self, err: UserError) -> None:
        super().__init__(str(err))


def _partition_count(text: str) -> int | None:
    """``--partitions``: a positive count, or "auto" (None: prepare picks it from the graph's size)."""
    return None if text == "auto" else positive_int(text)


def _print_raw_summary(verb: str, raw: "RawDataset") -> None:
    h = raw.header
    print(f"{verb} {raw.path}: {h.num_nodes:,} nodes, {h.num_edges:,} edges, {h.feat_dim}-dim {h.feat_dtype} "
          f"features, {h.num_classes} classes")


def _cmd_generate(args: argparse.Namespace) -> int:
    from loader.format.splits import parse_split_ratios
    from loader.offline.generate import generate_graph

    raw = generate_graph(Path(args.out), num_nodes=args.nodes, avg_degree=args.avg_degree, feat_dim=args.feat_dim,
                         num_classes=args.classes, seed=args.seed, feat_dtype=args.feat_dtype,
                         split=parse_split_ratios(args.split),
                         memory_budget=parse_size(args.memory_budget, name="--memory-budget"),
                         progress=args.progress)
    _print_raw_summary("generated", raw)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from loader.format.link import DEFAULT_EDGE_SPLIT, parse_edge_split
    from loader.format.splits import parse_split_ratios
    from loader.offline.importers import ImportOptions, import_dataset

    link_options = {"--edge-split": args.edge_split, "--edge-split-seed": args.edge_split_seed,
                    "--eval-negatives": args.eval_negatives}
    if args.task != "link" and any(value is not None for value in link_options.values()):
        given = ", ".join(name for name, value in link_options.items() if value is not None)
        raise UserError(f"{given}: only with --task link")
    edge_split = DEFAULT_EDGE_SPLIT if args.edge_split is None else parse_edge_split(args.edge_split)
    options = ImportOptions(undirected=args.undirected, drop_self_loops=args.drop_self_loops, dedup=args.dedup,
                            split=parse_split_ratios(args.split), split_seed=args.split_seed,
                            force_split=args.force_split, feat_dtype=args.feat_dtype, task=args.task,
                            edge_split=edge_split,
                            edge_split_seed=0 if args.edge_split_seed is None else args.edge_split_seed,
                            eval_negatives=100 if args.eval_negatives is None else args.eval_negatives)
    raw = import_dataset(Path(args.src), Path(args.out), fmt=args.format, options=options,
                         memory_budget=parse_size(args.memory_budget, name="--memory-budget"),
                         progress=args.progress)
    _print_raw_summary("imported", raw)
    return 0


AGGREGATION_KINDS = ("mean", "sum", "gcn")
"""``loader.offline.aggregation.KINDS``, spelled here so that parsing a command line imports no kernel."""


def _cmd_prepare(args: argparse.Namespace) -> int:
    from loader.offline.inspect_dataset import dataset_summary, format_summary
    from loader.offline.prepare import PrepareOptions, prepare_dataset

    options = PrepareOptions(num_partitions=args.partitions, partitioner=args.partitioner,
                             memory_budget=parse_size(args.memory_budget, name="--memory-budget"),
                             static_ratio=args.static_ratio, feat_dtype=args.feat_dtype, seed=args.seed,
                             progress=args.progress)
    dataset = prepare_dataset(Path(args.raw), Path(args.out), options)
    if args.aggregation_cache is not None:
        from loader.offline.aggregation import build_aggregation_cache

        try:
            build_aggregation_cache(dataset.path, args.aggregation_cache, options.memory_budget, progress=args.progress)
        except UserError as err:  # the dataset itself is complete: only the cache is missing
            raise UserError(f"{err} (the dataset at {dataset.path} is prepared; 'megabatch aggregate' adds the cache)"
                            ) from None
    print(format_summary(dataset_summary(dataset.path)))
    return 0


def _cmd_aggregate(args: argparse.Namespace) -> int:
    from loader.format.aggregates import aggregation_bytes
    from loader.format.dataset import open_dataset
    from loader.offline.aggregation import build_aggregation_cache
    from loader.sampling.pilot import pilot_nodes_per_hop

    cache = build_aggregation_cache(Path(args.dataset), args.kind,
                                    parse_size(args.memory_budget, name="--memory-budget"), progress=args.progress)
    dataset = open_dataset(args.dataset)
    hops = pilot_nodes_per_hop(dataset, args.batch_size, tuple(args.fanouts))
    without, with_cache = aggregation_bytes([round(h) for h in hops], dataset.manifest.row_bytes)
    report = {"dataset": str(dataset.path), "kind": cache.kind, "file": cache.file, "nodes_per_hop": hops,
              "bytes_per_batch_without": without, "bytes_per_batch_with": with_cache, "pays": with_cache < without}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        verdict = "pays" if with_cache < without else "does not pay (the last hop is thin)"
        print(f"aggregation cache ({cache.kind}) written to {dataset.path / cache.file}; a batch of "
              f"{args.batch_size} seeds with fanouts {list(args.fanouts)} fetches {without / 2**20:.2f} MiB of rows "
              f"without it, {with_cache / 2**20:.2f} MiB with it: the cache {verdict}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from loader.offline.verify import verify_dataset

    report = verify_dataset(Path(args.dataset), progress=args.progress)
    for problem in report.problems:
        print(f"FAIL {problem}")
    if report.ok:
        print(f"ok: {args.dataset} passed {len(report.checks)} checks ({', '.join(report.checks)})")
        return 0
    print(f"{args.dataset}: {len(report.problems)} problem(s) found", file=sys.stderr)
    return 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    from loader.offline.inspect_dataset import dataset_summary, format_summary

    summary = dataset_summary(Path(args.dataset))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from loader.daemon.config import load_config

    try:
        config = load_config(args.config)
    except UserError as err:
        raise _ConfigError(err) from None
    if not args.quiet:
        logging.getLogger().setLevel(config.log.level.upper())
    if args.check:
        from loader.daemon.check import check_serve

        try:
            print(check_serve(config, args.config))
        except UserError as err:
            raise _ConfigError(err) from None  # what serve would refuse, with serve's exit code
        return 0
    from loader.daemon.server import Daemon

    daemon = Daemon(config)
    try:
        daemon.run()
    except UserError as err:
        if daemon.ready.is_set():
            raise
        raise _ConfigError(err) from None  # the dataset or the socket path: found unusable before serving
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import time

    from loader.daemon.status import format_status, metrics_url, scrape, status_fields

    samples = scrape(metrics_url(args.config, args.url))
    print(json.dumps(status_fields(samples, now=time.time()), indent=2) if args.json else format_status(samples))
    return 0


def _cmd_top(args: argparse.Namespace) -> int:
    from loader.daemon.status import metrics_url
    from loader.daemon.top import run_top

    url = args.url if args.config is None else metrics_url(args.config, None)
    return run_top(url, interval=args.interval, once=args.once)


def _cmd_train(args: argparse.Namespace) -> int:
    # The trainer imports torch; the loader never does, so it runs in its own interpreter.
    flags = [f for f, on in (("--debug", args.debug), ("-q", args.quiet), ("--no-progress", not args.progress)) if on]
    argv = [sys.executable, "-m", "trainer", *flags, *args.train_args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 70  # not reached


def version_text() -> str:
    """What ``--version`` prints: the three versions an operator must match (a daemon refuses a dataset of
    another format major, a client of another protocol)."""
    from loader import __version__
    from loader.format.dataset import FORMAT_VERSION
    from proto.messages import PROTOCOL_VERSION

    return f"megabatch {__version__} (dataset format {FORMAT_VERSION}, wire protocol {PROTOCOL_VERSION})"


class _VersionAction(argparse.Action):
    """``--version``: argparse's own action wants the text when the parser is built; this one imports the
    versions only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megabatch", description="Out-of-core data loading for GNN training.")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the program, dataset format and wire protocol versions, then exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for unexpected errors")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar or lines")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = sub.add_parser("generate", help="write a synthetic raw graph (power-law, communities)")
    gen.add_argument("out", help="output raw dataset directory (must not exist)")
    gen.add_argument("--nodes", type=positive_int, required=True)
    gen.add_argument("--avg-degree", type=float, required=True, help="average degree (edges stored both ways)")
    gen.add_argument("--feat-dim", type=positive_int, required=True)
    gen.add_argument("--classes", type=positive_int, required=True)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--feat-dtype", choices=("float32", "float16"), default="float32")
    gen.add_argument("--split", default="0.6,0.2,0.2", help="train,val,test ratios (default 0.6,0.2,0.2)")
    gen.add_argument("--memory-budget", default="1G", help="chunk memory (default 1G)")
    gen.set_defaults(handler=_cmd_generate)

    imp = sub.add_parser("import", help="convert a user's graph (npz, OGB, numpy) into a raw dataset")
    imp.add_argument("src")
    imp.add_argument("out", help="output raw dataset directory (must not exist)")
    imp.add_argument("--format", required=True, choices=("npz", "ogb", "numpy"))
    imp.add_argument("--undirected", action="store_true", help="add the reverse of every edge")
    imp.add_argument("--drop-self-loops", action="store_true")
    imp.add_argument("--dedup", action="store_true", help="drop duplicate edges")
    imp.add_argument("--split", default="0.6,0.2,0.2", help="ratios for a split when the source has none")
    imp.add_argument("--split-seed", type=int, default=0)
    imp.add_argument("--force-split", action="store_true", help="replace the source's split with a new one")
    imp.add_argument("--feat-dtype", choices=("float32", "float16"), default="float32")
    imp.add_argument("--memory-budget", default="1G", help="chunk memory (default 1G)")
    imp.add_argument("--task", choices=("node", "link"), default="node",
                     help="node classification (default) or link prediction: also split the edges (docs/FORMAT.md)")
    imp.add_argument("--edge-split", default=None, help="--task link: train,val,test shares of the pairs, summing "
                     "to 1 (default 0.85,0.05,0.10)")
    imp.add_argument("--edge-split-seed", type=int, default=None, help="--task link: seed of the edge split and "
                     "of the negatives (default 0)")
    imp.add_argument("--eval-negatives", type=int, default=None, help="--task link: random tails per held-out "
                     "edge (default 100)")
    imp.set_defaults(handler=_cmd_import)

    prep = sub.add_parser("prepare", help="partition a raw dataset into the megabatch format")
    prep.add_argument("raw")
    prep.add_argument("out", help="output dataset directory (must not exist)")
    prep.add_argument("--partitions", type=_partition_count, default=None,
                      help="partitions, or auto (the default: at least 256, one per 4 MiB of features on a large "
                           "graph, at least 16 nodes each; docs/FORMAT.md)")
    prep.add_argument("--partitioner", choices=("metis", "stream", "random"), default="metis")
    prep.add_argument("--memory-budget", default="1G", help="peak data memory (default 1G)")
    prep.add_argument("--static-ratio", type=float, default=0.01, help="static cache fraction (default 0.01)")
    prep.add_argument("--feat-dtype", choices=("float32", "float16", "uint8"), default=None,
                      help="store features as (default: the raw dtype); uint8: per-column 8-bit codes, a quarter of "
                           "float32's bytes, decoded to float32 in every batch (docs/FORMAT.md, \"Feature codes\")")
    prep.add_argument("--seed", type=int, default=0, help="partitioner seed (default 0)")
    prep.add_argument("--aggregation-cache", choices=AGGREGATION_KINDS, default=None, metavar="KIND",
                      help="also build BatchGNN's aggregation cache of this kind (mean, sum or gcn; what 'megabatch "
                           "aggregate' builds, within --memory-budget)")
    prep.set_defaults(handler=_cmd_prepare)

    agg = sub.add_parser("aggregate", help="build BatchGNN's aggregation cache: every node's features aggregated "
                                           "over all its in-neighbours (docs/FORMAT.md)")
    agg.add_argument("dataset")
    agg.add_argument("--kind", default="mean", help="aggregator: mean, sum or gcn (default mean)")
    agg.add_argument("--memory-budget", default="1G", help="peak data memory (default 1G)")
    agg.add_argument("--batch-size", type=positive_int, default=1024,
                     help="batch of the cost estimate printed at the end (default 1024)")
    agg.add_argument("--fanouts", type=parse_fanouts, default=(10, 5), help="fanouts of that estimate (default 10,5)")
    agg.add_argument("--json", action="store_true", help="machine-readable output")
    agg.set_defaults(handler=_cmd_aggregate)

    ver = sub.add_parser("verify", help="check checksums and structure; exit 0 only if all hold")
    ver.add_argument("dataset")
    ver.set_defaults(handler=_cmd_verify)

    ins = sub.add_parser("inspect", help="summarize a prepared dataset")
    ins.add_argument("dataset")
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.set_defaults(handler=_cmd_inspect)

    srv = sub.add_parser("serve", help="run the loader daemon (see docs/CONFIG.md)")
    srv.add_argument("--config", required=True, help="TOML configuration file")
    srv.add_argument("--check", action="store_true",
                     help="validate the config, open the dataset and print the memory plan, then exit (0, or 78 "
                          "with the reason); starts nothing: no socket, no metrics port, no shared memory")
    srv.set_defaults(handler=_cmd_serve)

    sts = sub.add_parser("status", help="what a running daemon is doing (epoch, coverage, caches), from its metrics")
    where = sts.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="the daemon's TOML configuration (its [metrics] address and port)")
    where.add_argument("--url", help="the daemon's metrics URL, e.g. http://127.0.0.1:9450/metrics")
    sts.add_argument("--json", action="store_true", help="every field as JSON (docs/DEPLOY.md lists them)")
    sts.set_defaults(handler=_cmd_status)

    top = sub.add_parser("top", help="status redrawn every few seconds, with live rates (plain ANSI: works over ssh)")
    where = top.add_mutually_exclusive_group()
    where.add_argument("--config", help="the daemon's TOML configuration (its [metrics] address and port)")
    where.add_argument("--url", default="http://127.0.0.1:9450/metrics",
                       help="the daemon's metrics URL (default: http://127.0.0.1:9450/metrics, the default port)")
    top.add_argument("--interval", type=positive_seconds, default=2.0, help="seconds between frames (default 2)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.set_defaults(handler=_cmd_top)

    trn = sub.add_parser("train", help="train a GNN on batches from the daemon or in memory (python -m trainer)",
                         add_help=False, prefix_chars="\0")
    trn.add_argument("train_args", nargs=argparse.REMAINDER, help="arguments of 'python -m trainer' (--help there)")
    trn.set_defaults(handler=_cmd_train)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # stamped: outside journald nothing else records when a line was written, or at which level
    configure_logging(logging.WARNING if args.quiet else logging.INFO, stamped=True)
    if args.quiet:
        args.progress = False
    pin_malloc_thresholds()
    handler: Callable[[argparse.Namespace], int] = args.handler
    # SIGTERM behaves like Ctrl-C so temporary outputs are removed on the way out.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return handler(args)
    except _ConfigError as err:
        print(error_line(f"megabatch: error: {err} (configuration error: not retried, exit {EX_CONFIG})"),
              file=sys.stderr)
        return EX_CONFIG
    except UserError as err:
        print(error_line(f"megabatch: error: {err}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("megabatch: interrupted; no output was left behind", file=sys.stderr)
        return 130
    except OSError as err:
        where = f"{args.command}{f' ({err.filename})' if err.filename else ''}"
        print(error_line(f"megabatch: error: {io_error(err, where)}"), file=sys.stderr)
        return 1
    except Exception as err:  # the user interface is never a traceback
        if args.debug:
            traceback.print_exc()
        print(error_line(f"megabatch: internal error: {type(err).__name__}: {err} (rerun with --debug for details)"),
              file=sys.stderr)
        return 70
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
