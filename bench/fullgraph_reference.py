"""Full-graph GraphSAGE reference ("FULL" of bench/accuracy_bench.py): no sampling at all.

The model is the trainer's own: ``trainer.models.build_model("sage", ...)``, a 2-layer mean-aggregator
SAGEConv stack, seeded with ``trainer.loop.seed_everything(seed)`` before it is built, as the trainer
does. Its ``forward`` takes a sampled batch and trims one hop per layer, which cannot express "every
node, every edge" without an edge list of every edge (SAGEConv's message passing then gathers one
feature row per edge: 17 GB on coauthor-physics). So this module runs the model layer by layer
(``SampledGNN.layer``, ReLU and dropout between layers as its ``forward`` does) over the whole graph as
one sparse CSR adjacency (row = target, columns = its in-neighbours), which SAGEConv aggregates with
a sparse matrix product (mean over the in-neighbours; 0 for a node without any).

Training is full-batch: one Adam step per epoch on the loss over all training nodes, then validation
and test accuracy over all their nodes with every neighbour (no fanouts). Early stopping on
validation accuracy and the best-epoch bookkeeping follow ``megabatch train``: a better validation
accuracy is a strictly higher one; stop after ``--patience`` epochs without one. The graph, features,
labels and split come from the prepared dataset (``loader.format.dataset.open_dataset`` and
``loader.sampling.inmemory.load_in_memory``). The JSON written by ``--json-out`` has the shape of
``megabatch train --json-out`` for the keys the accuracy bench reads.

    .venv/bin/python bench/fullgraph_reference.py DATASET --seed 0 --json-out full.json \\
        [--max-epochs 200] [--patience 20] [--hidden 256] [--dropout 0.5] [--lr 0.003] [--layers 2] \\
        [--device auto]
"""

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from loader.format.dataset import open_dataset
from loader.sampling.inmemory import SPLITS, load_in_memory
from proto.atomic import atomic_file
from trainer.loop import resolve_device, seed_everything
from trainer.models import SampledGNN, build_model

__all__ = ["FullGraph", "FullConfig", "load_full_graph", "in_neighbour_adjacency", "full_graph_logits",
           "train_full_graph", "main"]


@dataclass(frozen=True)
class FullGraph:
    """A prepared dataset as tensors for full-batch training.

    x: (N, D) float32 features. adj_t: (N, N) sparse CSR, row v = node v's in-neighbours (what
    SAGEConv calls ``adj_t``). y: (N,) int64 labels, -1 for unlabeled. splits: "train", "val",
    "test" -> int64 node ids. num_classes: from the manifest.
    """

    x: Tensor
    adj_t: Tensor
    y: Tensor
    splits: dict[str, Tensor]
    num_classes: int

    def to(self, device: torch.device) -> "FullGraph":
        return FullGraph(self.x.to(device), self.adj_t.to(device), self.y.to(device),
                         {name: ids.to(device) for name, ids in self.splits.items()}, self.num_classes)


@dataclass(frozen=True)
class FullConfig:
    """Hyper-parameters of one full-batch run (defaults: the accuracy bench's)."""

    seed: int = 0
    max_epochs: int = 200
    patience: int | None = 20
    hidden: int = 256
    dropout: float = 0.5
    lr: float = 0.003
    layers: int = 2
    device: str = "auto"


def in_neighbour_adjacency(indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> Tensor:
    """The CSC of in-neighbours as a sparse CSR ``adj_t`` with unit values, columns sorted in each row
    (coalescing sorts them; the prepared CSC does not promise an order)."""
    counts = torch.from_numpy(np.diff(indptr).astype(np.int64))
    targets = torch.repeat_interleave(torch.arange(num_nodes, dtype=torch.int64), counts)
    sources = torch.from_numpy(indices.astype(np.int64))
    coo = torch.sparse_coo_tensor(torch.stack([targets, sources]), torch.ones(sources.numel()),
                                  (num_nodes, num_nodes), check_invariants=True).coalesce()
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return coo.to_sparse_csr()


def load_full_graph(path: Path) -> FullGraph:
    """Read a prepared dataset whole (graph, features as float32, labels, split)."""
    data = load_in_memory(open_dataset(path))
    graph = data.graph
    return FullGraph(x=torch.from_numpy(np.ascontiguousarray(data.features, dtype=np.float32)),
                     adj_t=in_neighbour_adjacency(graph.indptr, graph.indices, data.num_nodes),
                     y=torch.from_numpy(data.labels.astype(np.int64)),
                     splits={name: torch.from_numpy(data.splits[name].astype(np.int64)) for name in SPLITS},
                     num_classes=data.num_classes)


def full_graph_logits(model: SampledGNN, graph: FullGraph) -> Tensor:
    """Logits of every node: the model's layers over the whole graph (the body of ``SampledGNN.forward``
    without the trimming, which has nothing to drop here)."""
    x = graph.x
    for i in range(model.num_layers):
        x = model.layer(i, x, graph.adj_t)
        if i < model.num_layers - 1:
            x = F.dropout(F.relu(x), p=model.dropout, training=model.training)
    return x


def _accuracy(logits: Tensor, y: Tensor, ids: Tensor) -> float:
    labels = y[ids]
    mask = labels >= 0
    labelled = int(mask.sum())
    return int((logits[ids].argmax(1)[mask] == labels[mask]).sum()) / labelled if labelled else 0.0


def _train_step(model: SampledGNN, optimizer: torch.optim.Optimizer, graph: FullGraph) -> tuple[float, float]:
    """One full-batch step; (loss, training accuracy)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    logits = full_graph_logits(model, graph)
    train = graph.splits["train"]
    loss = F.cross_entropy(logits[train], graph.y[train], ignore_index=-1)
    loss.backward()
    optimizer.step()
    return float(loss.item()), _accuracy(logits.detach(), graph.y, train)


@torch.no_grad()
def _evaluate(model: SampledGNN, graph: FullGraph) -> tuple[float, float]:
    """(validation, test) accuracy with every neighbour."""
    model.eval()
    logits = full_graph_logits(model, graph)
    return _accuracy(logits, graph.y, graph.splits["val"]), _accuracy(logits, graph.y, graph.splits["test"])


def train_full_graph(graph: FullGraph, cfg: FullConfig) -> dict[str, Any]:
    """Train to ``cfg.max_epochs`` or early stop; a ``megabatch train --json-out``-shaped result."""
    device = resolve_device(cfg.device)
    graph = graph.to(device)
    seed_everything(cfg.seed)
    model = build_model("sage", int(graph.x.shape[1]), cfg.hidden, graph.num_classes, cfg.layers, cfg.dropout)
    assert isinstance(model, SampledGNN)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    result: dict[str, Any] = {"config": asdict(cfg), "device": str(device), "source": "full graph", "epochs": [],
                              "best_epoch": None, "best_val_acc": None, "test_acc_at_best": None,
                              "stopped_early": False}
    bad = 0
    for epoch in range(1, cfg.max_epochs + 1):
        started = time.perf_counter()
        loss, train_acc = _train_step(model, optimizer, graph)
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        val_acc, test_acc = _evaluate(model, graph)
        eval_s = time.perf_counter() - started
        result["epochs"].append({"epoch": epoch, "loss": loss, "train_acc": train_acc, "val_acc": val_acc,
                                 "test_acc": test_acc, "train_s": train_s, "eval_s": eval_s})
        if result["best_val_acc"] is None or val_acc > result["best_val_acc"]:
            result.update(best_epoch=epoch, best_val_acc=val_acc, test_acc_at_best=test_acc)
            bad = 0
        else:
            bad += 1
        if cfg.patience is not None and bad >= cfg.patience and epoch < cfg.max_epochs:
            result["stopped_early"] = True
            break
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", type=Path, help="prepared dataset directory")
    parser.add_argument("--json-out", type=Path, required=True)
    defaults = FullConfig()
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--max-epochs", type=int, default=defaults.max_epochs)
    parser.add_argument("--patience", type=int, default=defaults.patience, help="0: never stop early")
    parser.add_argument("--hidden", type=int, default=defaults.hidden)
    parser.add_argument("--dropout", type=float, default=defaults.dropout)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--layers", type=int, default=defaults.layers)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=defaults.device)
    args = parser.parse_args(argv)
    cfg = FullConfig(seed=args.seed, max_epochs=args.max_epochs, patience=args.patience or None, hidden=args.hidden,
                     dropout=args.dropout, lr=args.lr, layers=args.layers, device=args.device)
    result = train_full_graph(load_full_graph(args.dataset), cfg)
    with atomic_file(args.json_out, "w") as out:  # a reader (accuracy_bench --reuse) never sees half a file
        out.write(json.dumps(result, indent=2))
    print(f"full graph: best epoch {result['best_epoch']}: val {result['best_val_acc']:.4f}, "
          f"test {result['test_acc_at_best']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
