"""The trainer's training step as it runs against the ways it ran before, side by side on a dataset's own batches:
seconds of a step (forward, loss, backward; GraphSAGE, or GCN with ``--model gcn``, hidden 128, dropout 0.5, fanouts
10,5: for ``--task link`` an
MLP decoder and BCE on a link dataset's pairs, for ``--task node`` cross-entropy on a node dataset's seeds) and each
variant's ratio to the step as run:

    as run                 ``SampledGNN.forward``: ``trim_edges`` cuts each hop's edges (no row written that the next
                           layer drops), dropout masks from ``rand`` (``trainer.models.dropout``), layer 0's
                           aggregation matrix CSR from the edges as the samplers order them (``target_rows``)
    trim_to_layer + pad    PyG's pattern: the dropped rows padded back with zeros for ``trim_to_layer`` to cut (the
                           same outputs and gradients bit for bit, tests/trainer/test_models.py)
    F.dropout              torch's dropout, its CPU mask from ``bernoulli_`` (the same distribution, other draws)
    COO rows               the aggregation matrix as COO, sorted and coalesced (``coo_target_rows``, and for GCN its
                           self-loops appended to the edges first: ``coo_gcn_rows``; equal to float32 rounding)
    before 2026-11-30      all three

The first batch is untimed; the variants rotate which runs first.

    .venv/bin/python bench/step_bench.py --dataset DS [--task link|node] [--model sage|gcn] [--batch-size N]
        [--batches 10] [--rounds 3]

DS: a prepared dataset; for ``--task link`` one imported with ``--task link`` (``bench/link_bench.py`` makes
them). Prints a markdown table; nothing is written.
"""

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch_geometric.utils import trim_to_layer

from trainer.link.model import LinkModel
from trainer.models import SampledGNN, build_model, coo_target_rows, dropout, mean_weights


def pyg_pattern(encoder: SampledGNN, x: torch.Tensor, edge_index: torch.Tensor, nodes: list[int], edges: list[int],
                drop: Callable[[torch.Tensor, float, bool], torch.Tensor] = dropout) -> torch.Tensor:
    """``encoder``'s forward as PyG's hierarchical pattern runs it (and the model did before 2026-11-30): every
    row kept, ``trim_to_layer`` before each layer, the rows no later layer reads padded back for it to cut;
    ``drop`` the dropout between layers."""
    hops = encoder.num_layers
    for j in range(hops):
        x, edge_index, _ = trim_to_layer(j, nodes, edges, x, edge_index)
        outer = nodes[hops - j]
        x = encoder.layer(j, x, edge_index, x.size(0) - outer)
        if j < hops - 1:
            x = F.pad(drop(F.relu(x), encoder.dropout, encoder.training), (0, 0, 0, outer))
    return x[:nodes[0]]


def coo_gcn_rows(edge_index: torch.Tensor, num_targets: int, num_sources: int, dtype: torch.dtype) -> torch.Tensor:
    """GCN's layer-0 matrix as the model built it before 2026-11-30: the self-loops appended to the edges, then COO."""
    edges, weights = mean_weights(edge_index, num_sources)
    return coo_target_rows(edges, weights.to(dtype), num_targets, num_sources)


def _torch_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return F.dropout(x, p=p, training=training)


VARIANTS = {
    # name: (PyG's trim with padded rows, torch's dropout, COO rows)
    "as run": (False, False, False),
    "trim_to_layer + pad": (True, False, False),
    "F.dropout": (False, True, False),
    "COO rows": (False, False, True),
    "before 2026-11-30": (True, True, True),
}


def _forward(encoder: SampledGNN, variant: str, *args: Any) -> torch.Tensor:
    pad, torch_dropout, coo = VARIANTS[variant]
    drop = _torch_dropout if torch_dropout else dropout
    # the model's own functions swapped for the old ones for this call only
    with contextlib.ExitStack() as old:
        if torch_dropout:
            old.enter_context(mock.patch("trainer.models.dropout", _torch_dropout))
        if coo:
            old.enter_context(mock.patch("trainer.models.target_rows", coo_target_rows))
            old.enter_context(mock.patch("trainer.models.gcn_target_rows", coo_gcn_rows))
        return pyg_pattern(encoder, *args, drop=drop) if pad else encoder(*args)


def link_step_seconds(model: LinkModel, batch, variant: str) -> float:  # type: ignore[no-untyped-def]
    graph = batch.graph
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    args = (graph.x, graph.edge_index, graph.num_sampled_nodes, graph.num_sampled_edges)
    h = _forward(model.encoder, variant, *args)
    pairs = batch.edge_label_index
    logits = model.decode(h.index_select(0, pairs[0]), h.index_select(0, pairs[1]))
    F.binary_cross_entropy_with_logits(logits, batch.edge_label).backward()
    return time.perf_counter() - started


def node_step_seconds(model: SampledGNN, batch, variant: str) -> float:  # type: ignore[no-untyped-def]
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    args = (batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    logits = _forward(model, variant, *args)
    F.cross_entropy(logits, batch.y, ignore_index=-1).backward()
    return time.perf_counter() - started


def _link_setup(path: str, kind: str, batch_size: int, count: int) -> tuple[torch.nn.Module, list, Callable]:  # type: ignore[type-arg]
    from loader.format.dataset import open_dataset
    from trainer.link.inmemory import LinkInMemorySource

    source = LinkInMemorySource(open_dataset(path), batch_size=batch_size, seed=0)
    batches = [batch for _, batch in zip(range(count), source.train_batches(1), strict=False)]
    torch.manual_seed(0)
    return LinkModel(kind, source.num_features, 128, 2, 0.5, decoder="mlp").train(), batches, link_step_seconds


def _node_setup(path: str, kind: str, batch_size: int, count: int) -> tuple[torch.nn.Module, list, Callable]:  # type: ignore[type-arg]
    from trainer.inmemory_source import InMemorySource

    source = InMemorySource(path, batch_size=batch_size, seed=0)
    batches = [batch for _, batch in zip(range(count), source.train_batches(1), strict=False)]
    info = source.info
    torch.manual_seed(0)
    return build_model(kind, info.num_features, 128, info.num_classes, 2, 0.5).train(), batches, node_step_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True,
                        help="a prepared dataset (for --task link, one imported with --task link)")
    parser.add_argument("--task", choices=["link", "node"], default="link",
                        help="link: a link dataset's pairs (GraphSAGE + MLP decoder, BCE); node: a node dataset's "
                             "seeds (GraphSAGE, cross-entropy)")
    parser.add_argument("--model", choices=["sage", "gcn"], default="sage",
                        help="the encoder (default sage: GraphSAGE; gcn: GCN with the sampled mean's weights)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="positive pairs (link, default 256) or seeds (node, default 1024) per batch")
    parser.add_argument("--batches", type=int, default=10, help="timed batches per round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the batches (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = 256 if args.task == "link" else 1024
    if min(args.batch_size, args.batches, args.rounds, args.threads) < 1:
        parser.error("--batch-size, --batches, --rounds and --threads must be at least 1")
    from proto.errors import UserError

    torch.set_num_threads(args.threads)
    setup = _link_setup if args.task == "link" else _node_setup
    try:
        model, batches, step_seconds = setup(args.dataset, args.model, args.batch_size, args.batches + 1)
    except (UserError, OSError) as err:
        print(f"step_bench: error: {err}", file=sys.stderr)
        return 2
    names = tuple(VARIANTS)
    totals = dict.fromkeys(names, 0.0)
    for round_ in range(args.rounds):
        for index, batch in enumerate(batches):
            turn = (index + round_) % len(names)  # each variant runs first as often as the others
            for variant in names[turn:] + names[:turn]:
                took = step_seconds(model, batch, variant)
                if index:
                    totals[variant] += took
    timed = args.rounds * max(1, len(batches) - 1)
    mean = {variant: totals[variant] / timed for variant in names}
    unit = "pairs" if args.task == "link" else "seeds"
    print(f"{args.dataset} ({args.task}, {args.model}): {timed} steps each ({args.rounds} rounds of "
          f"{len(batches) - 1} batches of {args.batch_size} {unit}), {args.threads} thread(s)\n")
    print("| step | ms | vs as run |")
    print("|---|---|---|")
    for variant in names:
        print(f"| {variant} | {1e3 * mean[variant]:.1f} | {mean[variant] / mean['as run']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
