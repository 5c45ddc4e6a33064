"""``megabatch train``'s link-prediction flags (``--task``, ``--decoder``, ``--negatives``, ``--disjoint``, and the
training order: ``--link-order shuffled|comet|beta`` with ``--buffer-partitions C`` and ``--logical-partitions L``)
and the checks of what they may be combined with. Imports no torch (nor the loader, whose numba kernels take
a while to load): the parser's errors come in a blink. That a buffer fits the dataset's partitions is
checked once the dataset is open (``trainer.link.inmemory``)."""

import argparse
from collections.abc import Callable
from typing import NoReturn

from proto.cli_types import positive_int
from proto.messages import LINK_ORDERS  # the wire's names (DatasetInfo.link_order), the loader's too: no loader import
from trainer.link.ranking import LINK_METRIC_CHOICES, LINK_METRICS
from trainer.scores import METRIC_CHOICES

__all__ = ["TASKS", "DECODERS", "LINK_ORDERS", "ALL_METRIC_CHOICES", "DEFAULT_EMA", "DEFAULT_LINK_LR",
           "DEFAULT_BUFFER_LR", "LINK_ASSIGNMENTS", "default_lr", "add_arguments", "check_arguments", "ema_decay",
           "DAEMON_REFUSAL"]

TASKS = ("node", "link")
DECODERS = ("dot", "mlp")

ALL_METRIC_CHOICES = (*METRIC_CHOICES, *(name for name in LINK_METRICS if name not in METRIC_CHOICES))
"""What ``--metric`` accepts: the node task's choices, then the link task's that are not among them."""

DEFAULT_EMA = 0.99
"""``--ema``'s default for link prediction: evaluate an exponential moving average of the weights, whose time
constant (1 / (1 - decay) = 100 steps) is about an epoch of Cora's batches of 64 (docs/PERFORMANCE.md measures
it: about 2 MRR points in memory, in the shuffled order and the buffer orders)."""

DEFAULT_LINK_LR = 0.001
"""``--lr``'s default for link prediction in the shuffled order (the node task's is ``TrainConfig.lr``, 0.003).
Measured in memory (docs/PERFORMANCE.md, "The learning rate"): against 0.003 it gains 3-4 MRR points on Cora and
citeseer at batch 64 and 13 on amazon-photo, and loses none on Cora at batch 256, where 0.0003 loses 3 (too few
steps)."""

DEFAULT_BUFFER_LR = 0.0003
"""``--lr``'s default for a partition buffer order (``--link-order comet|beta``, or a daemon whose hierarchical mode
serves one): a state trains its buckets' edges as one block of correlated batches, and on amazon-photo (14 batches
a state) COMET at 0.001 lost 20 MRR points to the shuffled order and at 0.0003 about 9 (at 0.003 it did not
converge); on Cora it is as good as 0.001, on citeseer 1.2 points below (docs/PERFORMANCE.md)."""


LINK_ASSIGNMENTS = ("edge", "bucket")
"""``--link-assignment``: ``loader.sampling.buffer_order.ASSIGNMENTS`` (a test keeps them equal; this module parses
the command line without importing the loader)."""


def default_lr(order: str) -> float:
    """``--lr``'s default for link prediction in ``order`` ("shuffled", "comet" or "beta")."""
    return DEFAULT_LINK_LR if order == "shuffled" else DEFAULT_BUFFER_LR


def ema_decay(text: str) -> float:
    """``--ema DECAY``: 0 (off) or a decay in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
    return value


DAEMON_REFUSAL = ("not with --task link through the daemon (its [link] config sets the negatives and disjoint; it "
                  "trains the shuffled order, without a trainer feature cache)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    link = parser.add_argument_group("link prediction (--task link)")
    link.add_argument("--task", choices=TASKS, default="node",
                      help="node: node classification on the dataset's labels; link: link prediction on a dataset "
                           "imported with --task link, in memory or through a daemon serving one (default node)")
    # None, not the defaults: a node run given one of them is told they are link options
    link.add_argument("--decoder", choices=DECODERS, default=None,
                      help="edge decoder: dot product of the two embeddings, or a 2-layer MLP on their Hadamard "
                           "product (default dot)")
    link.add_argument("--negatives", type=positive_int, default=None, metavar="K",
                      help="training negatives per positive, random tails (default 1)")
    link.add_argument("--disjoint", action="store_true", default=None,
                      help="drop each training batch's positive edges from its own message passing, so the model "
                           "cannot read the answer off the graph (default: keep them)")
    link.add_argument("--link-order", choices=LINK_ORDERS, default=None,
                      help="training edge order: shuffled over the whole graph, or MariusGNN's partition buffer "
                           "orders comet and beta, where each buffer state trains its edge buckets with negatives "
                           "and neighbours from the resident partitions only (in memory; default shuffled)")
    link.add_argument("--buffer-partitions", type=positive_int, default=None, metavar="C",
                      help="--link-order comet|beta: partitions resident at once (2 <= C < the dataset's partitions)")
    link.add_argument("--negative-weights", action=argparse.BooleanOptionalAction, default=None,
                      help="--link-order comet|beta: weigh each negative so that the pair's own partitions, always "
                           "resident with it, weigh among its negatives what they would among uniform draws "
                           "(loader/sampling/negative_weights.py; default on)")
    link.add_argument("--ema", type=ema_decay, default=None, metavar="DECAY",
                      help="evaluate (and keep as the trained model) an exponential moving average of the weights, "
                           "updated after every step with this decay; 0 evaluates the last weights (default "
                           f"{DEFAULT_EMA}, about an epoch of steps at batch 64 on the small shared graphs)")
    link.add_argument("--link-assignment", choices=LINK_ASSIGNMENTS, default=None,
                      help="--link-order comet: edge splits each edge bucket's edges at random among every buffer "
                           "state that holds both its partitions; bucket trains each bucket whole in one of them, "
                           "as MariusGNN does (default edge; a daemon's is [link] assignment)")
    link.add_argument("--logical-partitions", type=positive_int, default=None, metavar="L",
                      help="--link-order comet: logical partitions the physical ones are grouped into each epoch "
                           "(default MariusGNN's 2P/C, rounded so that two fit the buffer)")


def check_arguments(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """``error`` (the parser's: one line, exit 2) for a combination the task does not take; ``args.mode``
    must be resolved ("daemon" or "inmemory")."""
    if args.task == "node":
        given = [flag for flag, value in (("--decoder", args.decoder), ("--negatives", args.negatives),
                                          ("--disjoint", args.disjoint), ("--link-order", args.link_order),
                                          ("--buffer-partitions", args.buffer_partitions),
                                          ("--logical-partitions", args.logical_partitions),
                                          ("--link-assignment", args.link_assignment),
                                          ("--negative-weights", args.negative_weights),
                                          ("--ema", args.ema)) if value is not None]
        if given:
            error(f"{', '.join(given)}: link-prediction options (--task link)")
        if args.metric not in METRIC_CHOICES:
            error(f"--metric {args.metric}: a link-prediction metric (--task link); node classification is judged "
                  f"by {', '.join(METRIC_CHOICES)}")
        return
    if args.mode == "daemon":
        given = [flag for flag, value in (("--negatives", args.negatives), ("--disjoint", args.disjoint),
                                          ("--link-order", args.link_order),
                                          ("--buffer-partitions", args.buffer_partitions),
                                          ("--logical-partitions", args.logical_partitions),
                                          ("--link-assignment", args.link_assignment),
                                          ("--negative-weights", args.negative_weights),
                                          ("--feature-cache", args.feature_cache or None)) if value is not None]
        if given:
            error(f"{', '.join(given)}: {DAEMON_REFUSAL}")
    node_only = [flag for flag, value in (("--micro-batches", args.micro_batches),
                                          ("--device-memory", args.device_memory),
                                          ("--aggregation-cache", args.aggregation_cache or None))
                 if value is not None]
    if node_only:
        error(f"{', '.join(node_only)}: node-classification options so far (not --task link)")
    if args.metric not in LINK_METRIC_CHOICES:
        error(f"--metric {args.metric}: not a link-prediction metric (--task link is judged by "
              f"{', '.join(LINK_METRIC_CHOICES)})")
    order = args.link_order or "shuffled"
    if order == "shuffled":
        given = [flag for flag, value in (("--buffer-partitions", args.buffer_partitions),
                                          ("--logical-partitions", args.logical_partitions),
                                          ("--link-assignment", args.link_assignment),
                                          ("--negative-weights", args.negative_weights)) if value is not None]
        if given:
            error(f"{', '.join(given)}: buffer options (--link-order comet or beta)")
    elif args.buffer_partitions is None:
        error(f"--link-order {order} needs --buffer-partitions C (the partitions resident at once)")
    elif order == "beta" and args.logical_partitions is not None:
        error("--logical-partitions: BETA swaps physical partitions (--link-order comet takes it)")
    elif order == "beta" and args.link_assignment is not None:
        error("--link-assignment: BETA trains each bucket in its first co-resident state (--link-order comet takes "
              "it)")
