"""The encoder's per-layer trim, the model's (``trim_edges``, no row written that the next layer drops) against
PyG's pattern (``trim_to_layer`` before each layer, the dropped rows padded back with zeros for it to cut),
side by side on a link dataset's own batches: seconds of a training step (forward, BCE, backward; GraphSAGE
hidden 128, MLP decoder, dropout 0.5, fanouts 10,5) and the ratio. Both give the same outputs and gradients
bit for bit (tests/trainer/test_models.py); the first batch is untimed, the two alternate which runs first.

    .venv/bin/python bench/trim_bench.py --dataset DS [--batch-size 256] [--batches 10] [--rounds 3]

DS: a dataset imported with ``--task link`` and prepared (``bench/link_bench.py`` makes them). Prints a
markdown table; nothing is written.
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch_geometric.utils import trim_to_layer

from trainer.link.model import LinkModel
from trainer.models import SampledGNN


def pyg_pattern(encoder: SampledGNN, x: torch.Tensor, edge_index: torch.Tensor, nodes: list[int],
                edges: list[int]) -> torch.Tensor:
    """``encoder``'s forward as PyG's hierarchical pattern runs it (and the model did before 2026-11-30): every
    row kept, ``trim_to_layer`` before each layer, the rows no later layer reads padded back for it to cut."""
    hops = encoder.num_layers
    for j in range(hops):
        x, edge_index, _ = trim_to_layer(j, nodes, edges, x, edge_index)
        outer = nodes[hops - j]
        x = encoder.layer(j, x, edge_index, x.size(0) - outer)
        if j < hops - 1:
            x = F.pad(F.dropout(F.relu(x), p=encoder.dropout, training=encoder.training), (0, 0, 0, outer))
    return x[:nodes[0]]


def step_seconds(model: LinkModel, batch, variant: str) -> float:  # type: ignore[no-untyped-def]
    graph = batch.graph
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    args = (graph.x, graph.edge_index, graph.num_sampled_nodes, graph.num_sampled_edges)
    h = model.embed(*args) if variant == "trim_edges" else pyg_pattern(model.encoder, *args)
    pairs = batch.edge_label_index
    logits = model.decode(h.index_select(0, pairs[0]), h.index_select(0, pairs[1]))
    F.binary_cross_entropy_with_logits(logits, batch.edge_label).backward()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="a link dataset (import --task link, then prepare)")
    parser.add_argument("--batch-size", type=int, default=256, help="positive pairs per batch (default 256)")
    parser.add_argument("--batches", type=int, default=10, help="timed batches per round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the batches (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    if min(args.batch_size, args.batches, args.rounds, args.threads) < 1:
        parser.error("--batch-size, --batches, --rounds and --threads must be at least 1")
    from loader.format.dataset import open_dataset
    from proto.errors import UserError
    from trainer.link.inmemory import LinkInMemorySource

    torch.set_num_threads(args.threads)
    try:
        source = LinkInMemorySource(open_dataset(args.dataset), batch_size=args.batch_size, seed=0)
    except (UserError, OSError) as err:
        print(f"trim_bench: error: {err}", file=sys.stderr)
        return 2
    batches = [batch for _, batch in zip(range(args.batches + 1), source.train_batches(1), strict=False)]
    torch.manual_seed(0)
    model = LinkModel("sage", source.num_features, 128, 2, 0.5, decoder="mlp").train()
    variants = ("trim_edges", "trim_to_layer + pad")
    totals = dict.fromkeys(variants, 0.0)
    for round_ in range(args.rounds):
        for index, batch in enumerate(batches):
            order = variants if (index + round_) % 2 else variants[::-1]
            for variant in order:
                took = step_seconds(model, batch, variant)
                if index:
                    totals[variant] += took
    timed = args.rounds * max(1, len(batches) - 1)
    mean = {variant: totals[variant] / timed for variant in variants}
    print(f"{args.dataset}: {timed} steps each ({args.rounds} rounds of {len(batches) - 1} batches of "
          f"{args.batch_size} pairs), {args.threads} thread(s)\n")
    print("| trim | ms per step | vs trim_edges |")
    print("|---|---|---|")
    for variant in variants:
        print(f"| {variant} | {1e3 * mean[variant]:.1f} | {mean[variant] / mean['trim_edges']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
