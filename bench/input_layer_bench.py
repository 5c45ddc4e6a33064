"""The trainer's input layer, aggregated by a sparse product (``SampledGNN.input_layer``), against PyG's message
passing, side by side on batch-shaped inputs: seconds per forward + backward and the ratios. The input layer runs
twice: on dense rows (``dense_inputs`` set), and as the trainer runs it, where its cost rule
(``max_sparse_entries``) multiplies sparse enough rows as sparse rows (trainer/sparse_input.py).

Shapes (sources, targets, edges, input width) stand for a layer 0 the trainer runs: a link batch of 256 pairs on
coauthor-cs (6,805 features), bench/compare's 1024-seed batch (256 features), a Cora link batch of 256 pairs
(1,433 features). The graph is random (the cost depends on the sizes, not on who links to whom); the rows are
normal draws, each non-zero with probability ``--densities`` (default 1, and coauthor-cs's 0.009); every input is
seeded. The paths are checked equal (to float32 rounding) before they are timed.

    .venv/bin/python bench/input_layer_bench.py [--models sage,gcn] [--densities 1,0.009] [--repeats 5] [--threads 1]

With ``--dataset DS`` (a dataset imported with ``--task link`` and prepared) it times whole training steps
instead (forward, loss, backward; GraphSAGE/GCN hidden 128, MLP decoder, fanouts 10,5) on the first
``--repeats`` + 1 batches of ``--batch-size`` pairs of DS's shuffled order, layer 0 on dense rows against layer 0 as
the trainer runs it, the first batch untimed; each batch's logits and gradients are checked equal first. Where
the source holds DS's features sparse (trainer/sparse_features.py), the dense column gets the batch's rows dense
(densified untimed) and a first table times gathering a batch's rows both ways, dense from the feature matrix
against as CSR from the held non-zeros:

    .venv/bin/python bench/input_layer_bench.py --dataset DS [--batch-size 256] [--models sage,gcn]

With ``--task node`` it times node-classification batches of the in-memory source instead (``--batch-size``
seeds; sampling, rows and a training step with Adam, GraphSAGE/GCN hidden 128)
with the features held dense against held sparse (``InMemorySource(hold_sparse=...)``), the same batches both ways:

    .venv/bin/python bench/input_layer_bench.py --dataset DS --task node --batch-size 1024

Prints a markdown table; nothing is written.
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from trainer.models import build_model, mean_weights

SHAPES = {
    "coauthor-cs link batch": (12_000, 5_000, 38_000, 6_805),
    "bench/compare batch": (55_000, 11_000, 51_000, 256),
    "cora link batch": (3_000, 700, 6_000, 1_433),
}
HIDDEN = 128


def pyg_layer(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor, targets: int) -> torch.Tensor:
    """Layer 0 by PyG's own message passing (what ``SampledGNN.layer`` ran before the sparse input layer)."""
    conv = model.convs[0]
    if model.kind == "sage":
        return conv((x, x[:targets]), edge_index)
    edges, weights = mean_weights(edge_index, x.size(0))
    return conv(x, edges, weights)[:targets]


def dense_layer(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor, targets: int) -> torch.Tensor:
    """Layer 0 as the trainer runs it on dense rows."""
    model.dense_inputs = True
    return model.layer(0, x, edge_index, targets)


def sparse_layer(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor, targets: int) -> torch.Tensor:
    """Layer 0 as the trainer runs it now: sparse rows where they are sparse enough."""
    model.dense_inputs = False
    return model.layer(0, x, edge_index, targets)


def seconds(layer, model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor, targets: int,
            repeats: int) -> float:
    """Mean seconds of ``layer``'s forward and backward, after one untimed call (first-call allocations)."""
    layer(model, x, edge_index, targets).sum().backward()
    start = time.perf_counter()
    for _ in range(repeats):
        layer(model, x, edge_index, targets).sum().backward()
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="sage,gcn", help="comma-separated: sage, gcn")
    parser.add_argument("--densities", default="1,0.009", help="comma-separated shares of non-zero input entries")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--dataset", default=None, help="a prepared link dataset: whole steps on its batches")
    parser.add_argument("--batch-size", type=int, default=256, help="with --dataset: pairs per batch (default 256)")
    parser.add_argument("--task", choices=("link", "node"), default="link",
                        help="with --dataset: link steps (default), or node batches held dense vs sparse")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    try:
        densities = [float(d) for d in args.densities.split(",")]
    except ValueError:
        densities = []
    if not models or any(m not in ("sage", "gcn") for m in models) or args.repeats < 1 or args.threads < 1:
        print("input_layer_bench: error: --models takes sage and/or gcn; --repeats and --threads >= 1", file=sys.stderr)
        return 2
    if args.batch_size < 1:
        print("input_layer_bench: error: --batch-size must be >= 1", file=sys.stderr)
        return 2
    if not densities or any(not 0.0 < d <= 1.0 for d in densities):
        print(f"input_layer_bench: error: --densities takes numbers in (0, 1], got {args.densities!r}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    if args.dataset is not None and args.task == "node":
        return node_table(args.dataset, models, args.batch_size, args.repeats, args.threads)
    if args.dataset is not None:
        return step_table(args.dataset, models, args.batch_size, args.repeats, args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), hidden {HIDDEN}, forward + backward of layer 0, "
          f"mean of {args.repeats}\n")
    print("| shape | model | sources, targets, edges, width | non-zero | PyG message passing | input layer, dense rows "
          "| input layer as run | vs PyG | vs dense rows |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (sources, targets, edges, width) in SHAPES.items():
        for density in densities:
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(sources, width, generator=gen)
            if density < 1.0:
                x *= torch.rand(sources, width, generator=gen) < density
            edge_index = torch.stack([torch.randint(0, sources, (edges,), generator=gen),
                                      torch.randint(0, targets, (edges,), generator=gen)])
            for kind in models:
                torch.manual_seed(0)
                model = build_model(kind, width, HIDDEN, 8, 2, 0.0)
                layers = (pyg_layer, dense_layer, sparse_layer)
                with torch.no_grad():
                    want, *gots = (layer(model, x, edge_index, targets) for layer in layers)
                for layer, got in zip(layers[1:], gots, strict=True):
                    if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                        print(f"input_layer_bench: error: {name}, {kind}, {layer.__name__}: differs from PyG's by "
                              f"{(got - want).abs().max().item():.2e}", file=sys.stderr)
                        return 1
                old, dense, new = (seconds(layer, model, x, edge_index, targets, args.repeats) for layer in layers)
                print(f"| {name} | {kind} | {sources:,}, {targets:,}, {edges:,}, {width:,} | {density:g} | "
                      f"{old * 1000:.1f} ms | {dense * 1000:.1f} ms | {new * 1000:.1f} ms | {old / new:.2f}x | "
                      f"{dense / new:.2f}x |")
    return 0


def step_seconds(model: torch.nn.Module, batch, dense: bool) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
    """One training step's forward, loss and backward on ``batch`` (a ``LinkBatch``), layer 0 on dense rows or as
    run: (seconds, logits, every parameter's gradient)."""
    model.encoder.dense_inputs = dense
    model.zero_grad()
    graph = batch.graph
    x = graph.x.to_dense() if dense and graph.x.layout == torch.sparse_csr else graph.x
    start = time.perf_counter()
    logits = model(x, graph.edge_index, graph.num_sampled_nodes, graph.num_sampled_edges,
                   batch.edge_label_index)
    F.binary_cross_entropy_with_logits(logits, batch.edge_label).backward()
    took = time.perf_counter() - start
    return took, logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def step_table(path: str, models: list[str], batch_size: int, repeats: int, threads: int) -> int:
    """``--dataset``: whole steps on the dataset's own batches, dense rows against as run."""
    from loader.format.dataset import open_dataset
    from proto.errors import UserError
    from trainer.link.inmemory import LinkInMemorySource
    from trainer.link.model import LinkModel

    try:
        dataset = open_dataset(path)
        source = LinkInMemorySource(dataset, batch_size=batch_size, seed=0)
    except (UserError, OSError) as err:
        print(f"input_layer_bench: error: {err}", file=sys.stderr)
        return 2
    stream = source.train_batches(1)
    batches = [batch for _, batch in zip(range(repeats + 1), stream, strict=False)]
    first = batches[0].graph
    print(f"torch {torch.__version__}, {threads} thread(s), {path}: batches of {batch_size} pairs, "
          f"{first.x.shape[0]:,} nodes of {first.x.shape[1]:,} features in the first; whole steps (forward, loss, "
          f"backward), mean of {len(batches) - 1} after one untimed\n")
    if source.sparse is not None:
        gather_table(source, dataset, batches, first.x.shape[1])
    print("| model | dense rows | as run | ratio |")
    print("|---|---|---|---|")
    for kind in models:
        torch.manual_seed(0)
        model = LinkModel(kind, source.num_features, HIDDEN, 2, 0.0, decoder="mlp")
        totals = {True: 0.0, False: 0.0}
        for index, batch in enumerate(batches):
            results = {dense: step_seconds(model, batch, dense) for dense in (True, False)}
            (_, want, want_grads), (_, got, got_grads) = results[True], results[False]
            if not torch.allclose(got, want, atol=1e-4, rtol=1e-4) or not all(
                    torch.allclose(a, b, atol=1e-4, rtol=1e-3) for a, b in zip(got_grads, want_grads, strict=True)):
                print(f"input_layer_bench: error: {kind}, batch {index}: the paths' steps differ", file=sys.stderr)
                return 1
            if index:
                for dense in totals:
                    totals[dense] += results[dense][0]
        dense, run = (totals[d] / max(1, len(batches) - 1) for d in (True, False))
        print(f"| {kind} | {dense * 1000:.1f} ms | {run * 1000:.1f} ms | {dense / run:.2f}x |")
    return 0


def node_table(path: str, models: list[str], batch_size: int, repeats: int, threads: int) -> int:
    """``--task node``: node-classification batches (sampling, rows, step) with features held dense vs sparse."""
    from loader.format.dataset import open_dataset
    from proto.errors import UserError
    from trainer.inmemory_source import InMemorySource

    try:
        sources = {hold: InMemorySource(open_dataset(path), batch_size=batch_size, seed=0, hold_sparse=hold)
                   for hold in (False, True)}
    except (UserError, OSError) as err:
        print(f"input_layer_bench: error: {err}", file=sys.stderr)
        return 2
    info = sources[False].info
    held = sources[True].sparse
    density = "too dense to hold sparse" if held is None else f"held sparse: {held.density:.2%} non-zero"
    print(f"torch {torch.__version__}, {threads} thread(s), {path}: node batches of {batch_size} seeds, "
          f"{info.num_features:,} features ({density}); sampling, rows and a step (Adam), mean of {repeats} "
          f"after one untimed, the two interleaved\n")
    print("| model | held dense | held sparse | ratio |")
    print("|---|---|---|---|")
    for kind in models:
        runs = {}
        for hold, source in sources.items():
            torch.manual_seed(0)
            model = build_model(kind, info.num_features, HIDDEN, info.num_classes, 2, 0.0)
            runs[hold] = (model, torch.optim.Adam(model.parameters(), lr=3e-3), _node_batches(source))
        totals = {False: 0.0, True: 0.0}
        for index in range(repeats + 1):
            # alternate which goes first, so neither pays the other's warm-up or cache misses alone
            for hold in ((False, True) if index % 2 else (True, False)):
                model, optimizer, stream = runs[hold]
                start = time.perf_counter()
                batch = next(stream)
                optimizer.zero_grad()
                out = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
                F.cross_entropy(out, batch.y).backward()
                optimizer.step()
                if index:
                    totals[hold] += time.perf_counter() - start
        dense, sparse = totals[False] / repeats, totals[True] / repeats
        print(f"| {kind} | {dense * 1000:.1f} ms | {sparse * 1000:.1f} ms | {dense / sparse:.2f}x |")
    return 0


def _node_batches(source):
    """Training batches epoch after epoch (a small training split is one batch an epoch)."""
    epoch = 0
    while True:
        yield from source.train_batches(epoch)
        epoch += 1


def gather_table(source, dataset, batches: list, width: int) -> None:
    """The rows of each batch gathered dense from the feature matrix against as CSR from the held non-zeros."""
    from dataclasses import replace

    from loader.sampling.inmemory import read_features
    from trainer.inmemory_source import batch_rows

    dense = replace(source.data, features=read_features(dataset))  # the source holds no dense matrix
    totals = {"dense": 0.0, "held": 0.0}
    for index, batch in enumerate(batches):
        nodes = batch.graph.n_id.numpy()
        for way, gather in (("dense", lambda ids: batch_rows(dense, None, ids)), ("held", source.sparse.rows)):
            start = time.perf_counter()
            gather(nodes)
            if index:
                totals[way] += time.perf_counter() - start
    dense, held = (totals[way] / max(1, len(batches) - 1) for way in ("dense", "held"))
    print(f"features held sparse: {source.sparse.density:.2%} of {width:,} columns non-zero\n")
    print("| a batch's rows | dense from the matrix | as CSR from the held non-zeros | ratio |")
    print("|---|---|---|---|")
    print(f"| gather | {dense * 1000:.1f} ms | {held * 1000:.1f} ms | {dense / held:.1f}x |\n")


if __name__ == "__main__":
    sys.exit(main())
