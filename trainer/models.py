"""GNN models for sampled mini-batches: GraphSAGE, GCN and GAT on PyG layers, trimmed per layer.

Every model takes a batch in PyG's sampled-subgraph layout (seeds first, hop-1 edges first) and
follows PyG's hierarchical pattern: before layer ``i``, ``trim_edges`` (``trim_to_layer``'s edge cut) drops the
outermost hop, whose nodes and edges no later layer reads, so deep layers compute on ever smaller graphs.
Each layer also skips the output rows of the hop the next trim drops (on coauthor-cs, 6805-dim
features and fanouts [10, 5], half of layer 1's rows, which makes its forward and backward
about 1.6x faster). The result is the seeds' logits only.
"""

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from trainer.sparse_input import SparseRows, max_sparse_entries, rows_times_weight, sparse_rows

__all__ = ["MODELS", "AGGREGATION_FOR", "SampledGNN", "build_model", "coo_target_rows", "dropout", "gcn_target_rows",
           "mean_weights", "target_rows", "trim_edges"]

MODELS = ("sage", "gcn", "gat")
AGGREGATION_FOR = {"sage": "mean", "gcn": "gcn"}
"""The aggregation cache each model's first layer can read (BatchGNN: SAGE's mean, GCN's normalized sum)."""


def trim_edges(layer: int, num_sampled_edges: list[int], edge_index: Tensor) -> Tensor:
    """``edge_index`` without the edges of the outermost hop left before layer ``layer`` (PyG's ``trim_to_layer``
    on the edges; hop-1 edges come first, so it is a prefix). Its row cut is not needed: each layer writes output
    rows only for the nodes the next one reads (``SampledGNN.forward``), where PyG's pattern writes every row and
    trims them after; padding the rows back for ``trim_to_layer`` cost a zero fill and a copy of the widest hidden
    layer per step, and as many in the backward pass."""
    if layer <= 0:
        return edge_index
    return edge_index.narrow(1, 0, edge_index.size(1) - num_sampled_edges[-layer])


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout(x, p, training)``, its mask drawn on the CPU as uniform floats compared with ``p``: torch's CPU
    ``bernoulli_`` takes 2.6x as long as ``rand`` and a comparison (41 against 15 ms for a 10,000 x 128 mask, the
    size of layer 0's output on bench/compare's batch), a quarter of a node step there. The same distribution (each
    entry kept with probability 1 - p, to float32's 2^-24, and scaled by 1 / (1 - p)) and the same gradient, from
    torch's generator, so seeds and checkpoints govern it as before; other devices keep ``F.dropout``."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * torch.rand_like(x).ge_(p).mul_(1.0 / (1.0 - p))  # ge_ in place: 1.0 / 0.0 in x's dtype


def mean_weights(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """``edge_index`` plus one self-loop per node, each edge weighted 1 / (in-degree of its target).

    The GCN layer's normalization on a sampled subgraph. The symmetric ``D^-1/2 (A+I) D^-1/2`` of
    full-graph GCN needs every source's degree, but on a sampled, trimmed subgraph the outermost
    sources have no sampled in-edges at all (degree 1 with the self-loop) while inner ones have up
    to ``fanout``: their messages would be weighted by an artefact of sampling. Normalizing by
    the target's sampled degree only (``D^-1 (A+I)``, the "GCN aggregator" of GraphSAGE) is the
    unbiased mean over the sampled neighbours and the node itself, whatever the fanout.
    """
    loops = torch.arange(num_nodes, device=edge_index.device, dtype=edge_index.dtype)
    full = torch.cat([edge_index, torch.stack([loops, loops])], dim=1)
    degree = torch.bincount(full[1], minlength=num_nodes).to(torch.float32)
    return full, degree.reciprocal()[full[1]]


def target_rows(edge_index: Tensor, weights: Tensor, num_targets: int, num_sources: int) -> Tensor:
    """The (num_targets x num_sources) sparse matrix with ``weights[e]`` at (target, source) of each edge e whose
    target is one of the first ``num_targets`` rows (repeated edges summed), so that its product with the source
    rows ``x`` is the weighted sum over each target's in-edges.

    The loader's samplers emit a batch's edges grouped by target in target order (each target's neighbours in
    turn, hop by hop: every mode's batches, in memory and through the daemon), and on the CPU such edges make a
    CSR matrix as they stand, where ``coo_target_rows`` sorts and coalesces (11 ms of an 80 ms node step on
    bench/compare's batch; the aggregation's forward and backward about 2x faster); duplicates in a row are summed
    by the product as coalescing would. Edges in any other order (GCN's appended self-loops, a hand-made batch) or
    on another device take the COO path. The two sum in different orders: equal to float32 rounding. Indices are
    in range by construction (sources index ``x``, targets are filtered), so torch's invariant checks are opted
    out of."""
    targets = _targets_in_order(edge_index)
    if targets is None or targets.numel() == 0:
        return coo_target_rows(edge_index, weights, num_targets, num_sources)
    kept = int(torch.searchsorted(targets, num_targets))  # sorted: the targets < num_targets are a prefix
    crow = torch.zeros(num_targets + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(targets[:kept], minlength=num_targets), 0, out=crow[1:])
    columns = edge_index[0, :kept].to(torch.int64).contiguous()
    return _csr(crow, columns, weights[:kept].contiguous(), num_targets, num_sources)


def gcn_target_rows(edge_index: Tensor, num_targets: int, num_sources: int, dtype: torch.dtype) -> Tensor:
    """``target_rows`` of ``mean_weights(edge_index, num_sources)``, GCN's layer-0 matrix: each target's row holds its
    in-edges and its self-loop, all weighted 1 / (in-degree + 1).

    ``mean_weights`` appends the self-loops after the edges, which breaks the target order ``target_rows`` makes CSR
    from; on the CPU, edges in target order make this CSR directly instead, each row's self-loop after its edges
    (no sort, no coalescing; equal to float32 rounding, as ``target_rows``). Other orders and devices take COO."""
    targets = _targets_in_order(edge_index)
    if targets is None:
        edges, weights = mean_weights(edge_index, num_sources)
        return target_rows(edges, weights.to(dtype), num_targets, num_sources)
    kept = int(torch.searchsorted(targets, num_targets))
    lengths = torch.bincount(targets[:kept], minlength=num_targets) + 1
    crow = torch.zeros(num_targets + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=crow[1:])
    columns = torch.empty(kept + num_targets, dtype=torch.int64)
    # edge e of row t lands after the t self-loops of the rows before; row t's own self-loop ends the row
    columns[torch.arange(kept) + targets[:kept]] = edge_index[0, :kept].to(torch.int64)
    columns[crow[1:] - 1] = torch.arange(num_targets)
    values = lengths.to(dtype).reciprocal_().repeat_interleave(lengths, output_size=kept + num_targets)
    return _csr(crow, columns, values, num_targets, num_sources)


def _targets_in_order(edge_index: Tensor) -> Tensor | None:
    """The edges' targets as a contiguous copy where they are on the CPU and in target order (the samplers'
    order, from which the layer-0 matrices are built CSR), else None (COO). A slot's ``edge_index`` may be a
    strided view: searchsorted and the CSR want their own contiguous arrays."""
    targets = edge_index[1]
    if edge_index.device.type != "cpu" or not bool((targets[1:] >= targets[:-1]).all()):
        return None
    return targets.contiguous()


def _csr(crow: Tensor, columns: Tensor, values: Tensor, num_targets: int, num_sources: int) -> Tensor:
    """A (num_targets x num_sources) CSR matrix, its invariants unchecked (in range by construction)."""
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is not
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, columns, values, (num_targets, num_sources), check_invariants=False)


def coo_target_rows(edge_index: Tensor, weights: Tensor, num_targets: int, num_sources: int) -> Tensor:
    """``target_rows``'s matrix as COO, sorted and coalesced: edges in any order, on any device."""
    keep = edge_index[1] < num_targets
    kept = edge_index[:, keep]
    return torch.sparse_coo_tensor(torch.stack([kept[1], kept[0]]), weights[keep],
                                   (num_targets, num_sources), check_invariants=False).coalesce()


class SampledGNN(torch.nn.Module):
    """A stack of ``num_layers`` PyG convolutions with ReLU and dropout between them.

    ``kind`` is "sage" (SAGEConv, mean aggregation), "gcn" (GCNConv with ``mean_weights``:
    ``normalize=False, add_self_loops=False``, the self-loops and weights supplied per batch) or
    "gat" (GATConv; hidden layers concatenate ``heads`` heads of ``hidden // heads`` channels, so
    every model is ``hidden`` wide; the output layer has one head).
    """

    def __init__(self, kind: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float,
                 heads: int = 4, aggregation: str = "") -> None:
        super().__init__()
        if kind not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {kind!r}")
        if aggregation and AGGREGATION_FOR.get(kind) != aggregation:
            want = AGGREGATION_FOR.get(kind)
            raise ValueError(f"model {kind} reads " + (f"a {want!r} aggregation cache" if want else "no aggregation "
                             "cache (attention needs every edge)") + f", the batches carry {aggregation!r}")
        self.aggregation = aggregation
        for name, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                            ("num_layers", num_layers), ("heads", heads)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if kind == "gat" and hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads}) for gat")
        self.kind = kind
        self.dense_inputs = False
        """Set, layer 0 never takes ``sparse_input_layer`` (tests and bench/input_layer_bench.py compare the paths)."""
        self.num_layers = num_layers
        self.dropout = dropout
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = torch.nn.ModuleList()
        for i in range(num_layers):
            last = i == num_layers - 1
            conv: torch.nn.Module
            if kind == "sage":
                conv = SAGEConv(dims[i], dims[i + 1], aggr="mean")
            elif kind == "gcn":
                conv = GCNConv(dims[i], dims[i + 1], add_self_loops=False, normalize=False)
            elif last:
                conv = GATConv(dims[i], dims[i + 1], heads=1, concat=False)
            else:
                conv = GATConv(dims[i], dims[i + 1] // heads, heads=heads, concat=True)
            self.convs.append(conv)

    def layer(self, index: int, x: Tensor, edge_index: Tensor, num_targets: int | None = None) -> Tensor:
        """Convolution ``index`` over a homogeneous (trimmed) subgraph; output rows for the first
        ``num_targets`` nodes of ``x`` (default: all of them).

        SAGE runs bipartite (sources ``x``, targets ``x[:num_targets]``), so neither of its linear
        maps touches the rows no later layer reads. GCN and GAT transform every source row anyway
        (and GATConv would transform the target rows a second time if given a pair), so they run
        on the whole subgraph and keep the target rows.
        """
        conv = self.convs[index]
        targets = x.size(0) if num_targets is None else num_targets
        if index == 0 and self.kind in AGGREGATION_FOR:
            return self.input_layer(x, edge_index, targets)
        if self.kind == "sage":
            return conv((x, x[:targets]), edge_index)
        if self.kind == "gcn":
            edges, weights = mean_weights(edge_index, x.size(0))
            return conv(x, edges, weights)[:targets]
        return conv(x, edge_index)[:targets]

    def input_layer(self, x: Tensor, edge_index: Tensor, num_targets: int) -> Tensor:
        """Layer 0 of SAGE or GCN on the input features, the same function as the PyG layer's but aggregated first,
        by a sparse product over the target rows, then transformed: PyG's message passing would gather one
        feature row per edge (an E x F tensor, 1 GB for a link batch on coauthor-cs's 6,805 features) and GCN
        would transform every source row, where only the targets' are read. On the input rows, which need no
        gradient, SAGE measured 1.3-2.1x faster and GCN up to 5x, though 10% slower on 6,805 features
        (docs/PERFORMANCE.md, "The input layer"); deeper layers, narrow and with a gradient to carry back, stay on
        PyG's path, which is faster there."""
        sources = x.size(0)
        if self.kind == "sage":
            degree = torch.bincount(edge_index[1], minlength=sources).clamp_(min=1).to(x.dtype)
            rows = target_rows(edge_index, degree.reciprocal()[edge_index[1]], num_targets, sources)
        else:
            rows = gcn_target_rows(edge_index, num_targets, sources, x.dtype)
        budget = 0 if self.dense_inputs else max_sparse_entries(sources, num_targets, x.size(1))
        features = sparse_rows(x, budget)
        if features is not None:
            return self.sparse_input_layer(features, rows, num_targets)
        if x.layout == torch.sparse_csr:
            x = x.to_dense()
        # the sampled neighbours' aggregate takes the place of the cache's: the same linear maps follow
        return self.aggregated_layer(x[:num_targets], torch.sparse.mm(rows, x))

    def sparse_input_layer(self, features: SparseRows, rows: Tensor, num_targets: int) -> Tensor:
        """``input_layer`` on sparse input rows (trainer/sparse_input.py): transformed first, then aggregated, which
        linearity allows (``A (X W) = (A X) W``) and which costs in proportion to the non-zeros of ``X``."""
        conv = self.convs[0]
        if self.kind == "sage":
            assert isinstance(conv, SAGEConv)
            out = (torch.sparse.mm(rows, rows_times_weight(features, conv.lin_l.weight))
                   + rows_times_weight(features.first(num_targets), conv.lin_r.weight))
            for bias in (conv.lin_l.bias, conv.lin_r.bias):
                if bias is not None:
                    out = out + bias
            return out
        assert isinstance(conv, GCNConv) and conv.bias is not None
        return torch.sparse.mm(rows, rows_times_weight(features, conv.lin.weight)) + conv.bias

    def aggregated_layer(self, x: Tensor, x_agg: Tensor) -> Tensor:
        """Layer 0's linear maps on an aggregate of the input rows ``x_agg`` (one row per row of ``x``): SAGE's
        ``lin_l(mean of the neighbours) + lin_r(x)``, GCN's ``(A_hat X) W + b``. From the aggregation cache, for
        every node of the batch and no message passing (the cache holds A_hat X with the global degrees, BatchGNN's
        normalization), or from ``input_layer``'s aggregate over the sampled neighbours: the same parameters."""
        conv = self.convs[0]
        if self.kind == "sage":
            assert isinstance(conv, SAGEConv)
            return conv.lin_l(x_agg) + conv.lin_r(x)
        assert isinstance(conv, GCNConv) and conv.bias is not None
        return conv.lin(x_agg) + conv.bias

    def forward(self, x: Tensor, edge_index: Tensor, num_sampled_nodes: list[int],
                num_sampled_edges: list[int], x_agg: Tensor | None = None) -> Tensor:
        """Logits of the ``num_sampled_nodes[0]`` seed nodes (the first rows of ``x``). With ``x_agg`` (an
        aggregation cache's rows) the batch holds one hop fewer than the model's layers."""
        layers = self.num_layers
        first = 0 if x_agg is None else 1
        if len(num_sampled_edges) != layers - first:
            raise ValueError(f"batch has {len(num_sampled_edges)} sampled hops, the model {layers} layers"
                             + ("" if x_agg is None else " and reads an aggregation cache"))
        weight = next(self.parameters())
        if x.layout == torch.sparse_csr and (x_agg is not None or self.kind not in AGGREGATION_FOR):
            x = x.to_dense()  # held-sparse rows (trainer/sparse_features.py) that only input_layer takes as such
        if x.dtype != weight.dtype:
            # float16 features (prepare --feat-dtype float16) cross the slot and PCIe at half the bytes and are
            # widened here, on the training device
            x = x.to(weight.dtype)
        if x_agg is not None:
            if not self.aggregation:
                raise ValueError("the batch carries an aggregation cache the model was not built for")
            x = self.aggregated_layer(x, x_agg.to(weight.dtype))
            if layers > 1:
                x = dropout(F.relu(x), self.dropout, self.training)
        hops = layers - first
        for j in range(hops):
            # trim_to_layer's edge cut; its row cut is already made, as the previous layer wrote no rows for the hop
            edge_index = trim_edges(j, num_sampled_edges, edge_index)
            # the outermost hop left only sends messages at this layer: no output rows for it
            outer = num_sampled_nodes[hops - j]
            i = j + first
            x = self.layer(i, x, edge_index, x.size(0) - outer)
            if i < layers - 1:
                x = dropout(F.relu(x), self.dropout, self.training)
        return x[:num_sampled_nodes[0]]


def build_model(name: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float,
                heads: int = 4, aggregation: str = "") -> torch.nn.Module:
    """A ``SampledGNN`` of kind ``name`` ("sage", "gcn" or "gat"); ``heads`` (default 4) is used by gat only;
    ``aggregation``: the kind of aggregation cache its batches carry ("" none; ``AGGREGATION_FOR``)."""
    return SampledGNN(name, in_dim, hidden, out_dim, num_layers, dropout, heads, aggregation)
