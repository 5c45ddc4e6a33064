"""Betty's micro-batches: one sampled batch split into K that train to the same update.

A batch whose activations do not fit the device is trained as K micro-batches, one after another,
gradients accumulating, one optimizer step per batch. A micro-batch takes a group of the batch's seeds
and exactly what their logits depend on in the batch: every sampled in-edge of every node it must
compute, level by level, and those edges' sources. Each of the three models aggregates over a node's
in-edges only (SAGE's mean, GCN's target-degree weights of ``trainer.models.mean_weights``, GAT's
softmax over in-edges), so a seed's logits are the same in its micro-batch as in the whole batch, and
with each micro-batch's loss summed over its seeds and divided by the batch's labelled seeds, the
accumulated gradient is the batch's (up to float rounding; dropout masks are drawn per micro-batch).

Which seeds go together decides the cost: seeds that share neighbours, put apart, bring those
neighbours (and their whole sampled fan) into several micro-batches. Betty (seed 004) partitions the
output nodes with METIS on the redundancy-embedded graph (REG = A A^T over the seeds, A the seeds'
hop-1 block: an edge weight is the number of sampled neighbours two seeds share), so the input nodes
summed over the micro-batches stay close to the batch's. ``random_groups`` is the baseline.

``estimate_bytes`` predicts a micro-batch's peak from its per-hop sizes and the model, and
``choose_groups`` picks the smallest K whose largest micro-batch fits ``--device-memory``.
"""

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from proto.errors import UserError
from trainer.batch import Batch

__all__ = ["MicroBatch", "split_batch", "reg_groups", "random_groups", "redundancy", "ModelShape",
           "estimate_bytes", "choose_groups", "GroupChoice", "ACTIVATION_MARGIN", "CUDA_STEP_OVERHEAD", "MicroBatching",
           "measure_step_bytes"]


@dataclass(frozen=True)
class MicroBatch:
    """A micro-batch (a ``Batch`` in the same layout, its own local ids) and the positions of its seeds
    among the whole batch's seeds (``seeds[i]`` is the batch seed of the micro-batch's seed ``i``)."""

    batch: Batch
    seeds: Tensor


def _in_edge_order(batch: Batch) -> tuple[Tensor, Tensor]:
    """(edge ids sorted by target, CSR pointer over targets): every node's in-edges, any hop."""
    target = batch.edge_index[1]
    order = torch.argsort(target, stable=True)
    nodes = sum(batch.num_sampled_nodes)
    ptr = torch.zeros(nodes + 1, dtype=torch.long, device=target.device)
    ptr[1:] = torch.cumsum(torch.bincount(target, minlength=nodes), 0)
    return order, ptr


def _gather_in_edges(order: Tensor, ptr: Tensor, nodes: Tensor) -> Tensor:
    """The ids of every in-edge of ``nodes`` (grouped by node, in ``nodes``' order)."""
    starts = ptr[nodes]
    counts = ptr[nodes + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return order[:0]
    base = torch.repeat_interleave(starts - (torch.cumsum(counts, 0) - counts), counts)
    return order[base + torch.arange(total, device=order.device)]


def split_batch(batch: Batch, groups: Tensor) -> list[MicroBatch]:
    """The micro-batches of ``batch`` for ``groups`` (int64 (seeds,): the group of each seed, 0..K-1).

    Groups without a seed give no micro-batch. ``batch`` must be a plain batch (its cache plan applied).
    """
    if batch.cache_plan is not None:
        raise ValueError("split_batch needs the batch's full x: apply its feature cache plan first")
    seeds = batch.num_sampled_nodes[0]
    if groups.shape != (seeds,):
        raise ValueError(f"groups has shape {tuple(groups.shape)}, expected ({seeds},)")
    layers = len(batch.num_sampled_edges)
    device = batch.edge_index.device
    groups = groups.to(device)  # the partitioners work on the CPU; a batch may be on the GPU
    order, ptr = _in_edge_order(batch)
    nodes = ptr.shape[0] - 1
    out: list[MicroBatch] = []
    for group in torch.unique(groups).tolist():
        members = torch.nonzero(groups == group).flatten()
        level = torch.full((nodes,), -1, dtype=torch.long, device=device)
        level[members] = 0
        per_level, per_hop_edges = [members], []
        frontier = members
        for hop in range(layers):
            edges = _gather_in_edges(order, ptr, frontier)
            sources = batch.edge_index[0, edges]
            fresh = torch.unique(sources[level[sources] < 0])
            level[fresh] = hop + 1
            per_level.append(fresh)
            per_hop_edges.append(edges)
            frontier = fresh
        picked = torch.cat(per_level)
        local = torch.full((nodes,), -1, dtype=torch.long, device=device)
        local[picked] = torch.arange(picked.shape[0], device=device)
        edges = torch.cat(per_hop_edges)
        micro = Batch(batch.x[picked], batch.y[members], local[batch.edge_index[:, edges]],
                      batch.n_id[picked.to(batch.n_id.device)], [int(n.shape[0]) for n in per_level],
                      [int(e.shape[0]) for e in per_hop_edges], batch.seq, None, batch.global_seeds,
                      batch.stream_batches, None if batch.x_agg is None else batch.x_agg[picked], batch.class_weight)
        out.append(MicroBatch(micro, members))
    return out


def random_groups(seeds: int, k: int, generator: torch.Generator | None = None) -> Tensor:
    """Seeds dealt at random into ``k`` groups of equal size (to one)."""
    perm = torch.randperm(seeds, generator=generator)
    groups = torch.empty(seeds, dtype=torch.long)
    groups[perm] = torch.arange(seeds) % max(1, k)
    return groups


def reg_groups(batch: Batch, k: int, seed: int = 0) -> Tensor:
    """Betty's REG + METIS: ``k`` balanced groups of seeds cutting as few shared hop-1 neighbours as possible."""
    import pymetis  # a dependency of the package; imported here so that a trainer without micro-batches never loads it

    seeds = batch.num_sampled_nodes[0]
    k = max(1, min(k, seeds))
    if k == 1:
        return torch.zeros(seeds, dtype=torch.long)
    hop1 = batch.edge_index[:, :batch.num_sampled_edges[0]].cpu()
    nodes = sum(batch.num_sampled_nodes)
    # A: seeds x nodes, A[s, v] = 1 when v was sampled as a neighbour of s (a seed counts as its own input)
    rows = torch.cat([hop1[1], torch.arange(seeds)])
    cols = torch.cat([hop1[0], torch.arange(seeds)])
    with warnings.catch_warnings():  # torch's notes that sparse support is beta and unchecked: checked here
        warnings.simplefilter("ignore", UserWarning)
        a = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(rows.shape[0]), (seeds, nodes),
                                    check_invariants=True).coalesce()
        a = torch.sparse_coo_tensor(a.indices(), torch.ones_like(a.values()), a.shape)  # a set, not a multiset
        reg = torch.sparse.mm(a, a.t()).coalesce()
    i, j = reg.indices()
    weights = reg.values()
    off = i != j
    i, j, weights = i[off].numpy(), j[off].numpy(), weights[off].numpy().astype(np.int64)
    xadj = np.zeros(seeds + 1, dtype=np.int64)
    np.cumsum(np.bincount(i, minlength=seeds), out=xadj[1:])
    options = pymetis.Options(seed=seed)
    _, membership = pymetis.part_graph(k, adjacency=pymetis.CSRAdjacency(adj_starts=xadj, adjacent=j),
                                       eweights=weights, options=options)
    return torch.as_tensor(np.asarray(membership, dtype=np.int64))


def redundancy(parts: list[MicroBatch], batch: Batch) -> float:
    """Input nodes summed over the micro-batches / input nodes of the batch (1.0: no node loaded twice)."""
    return sum(p.batch.x.shape[0] for p in parts) / max(1, batch.x.shape[0])


CUDA_STEP_OVERHEAD = 64 << 20
"""What a CUDA step allocates beyond its tensors' bytes: cuBLAS workspaces and the caching allocator's rounding,
taken through it (measured on an H200: 30-50 MiB over the counted tensors of a micro-batch)."""
ACTIVATION_MARGIN = 1.25
"""The estimate's activations over the count above: the measured peaks of SAGE, GCN and GAT on amazon-photo,
coauthor-cs and cora batches (whole and in micro-batches) were up to 1.14x the bare count (coauthor-cs, SAGE)."""


SPARSE_ENTRY_BYTES = 20
"""An entry of a sparse COO matrix: its two int64 indices and a float32 value."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of the model: kind, widths per layer, GAT heads, bytes per value."""

    kind: str
    in_dim: int
    hidden: int
    out_dim: int
    num_layers: int
    heads: int = 4
    feature_bytes: int = 4
    device_overhead: int = 0
    """Bytes a step takes on the device beyond its tensors (``CUDA_STEP_OVERHEAD`` on CUDA, 0 on the CPU)."""


def estimate_bytes(nodes_per_hop: list[int], edges_per_hop: list[int], model: ModelShape) -> int:
    """Predicted peak bytes of one training step (forward and backward) on a batch of these sizes: the
    batch itself, the model's weights, gradients and Adam moments, what autograd keeps of every layer, and
    the largest transient (docs/PERFORMANCE.md, "Micro-batches").

    Layer i (0-based) reads the nodes of hops 0..L-i (``n_in``) and the edges of hops 1..L-i (``e``),
    and writes rows for hops 0..L-1-i (``n_out``); d_in, d_out its widths. Kept, in float32 (measured
    with the profiler's memory timeline on the CPU and with ``max_memory_allocated`` on CUDA):
    SAGE the mean of the gathered rows (n_out x d_in) and both linear maps' outputs, with a transient
    e x d_in gather; GCN the transformed rows (n_in x d_out) and the weighted messages over the edges and
    self-loops ((e + n_in) x d_out, kept and transient); GAT the same rows, three message tensors over the
    edges and self-loops and the attention per head; hidden layers add ReLU and dropout.
    Layer 0 of SAGE and GCN aggregates the input rows by a sparse product instead (``SampledGNN.input_layer``):
    the aggregate (n_out x d_in), the linear maps' outputs and the sparse matrix (``SPARSE_ENTRY_BYTES`` an
    entry, over the edges, and for GCN the self-loops), three times that and a second aggregate-sized buffer transient
    while it is coalesced and multiplied.
    """
    layers = model.num_layers
    dims = [model.in_dim] + [model.hidden] * (layers - 1) + [model.out_dim]
    f32 = 4
    total_nodes = sum(nodes_per_hop)
    batch = total_nodes * model.in_dim * model.feature_bytes + total_nodes * 8 + sum(edges_per_hop) * 16
    kept = transient = 0
    for i in range(layers):
        n_in = sum(nodes_per_hop[:layers - i + 1])
        n_out = sum(nodes_per_hop[:layers - i])
        e = sum(edges_per_hop[:layers - i])
        d_in, d_out = dims[i], dims[i + 1]
        if i == 0 and model.kind in ("sage", "gcn"):
            # trainer.models' input layer: a sparse product first (its matrix kept, its coalescing transient),
            # then the linear maps on the aggregate, which autograd keeps; GCN's matrix holds the self-loops too
            entries = (e if model.kind == "sage" else e + n_in) * SPARSE_ENTRY_BYTES
            kept += (n_out * d_in + 2 * n_out * d_out) * f32 + entries
            # and an aggregate-sized buffer: without it the estimate fell 0.2% short of the profiler's peak for a
            # 1000-wide SAGE batch on the CPU
            layer_transient = 3 * entries + n_out * d_in * f32
        elif model.kind == "gat":
            heads = 1 if i == layers - 1 else model.heads
            kept += (n_in * d_out + 3 * (e + n_in) * d_out + 4 * (e + n_in) * heads) * f32
            layer_transient = (e + n_in) * d_out * f32
        elif model.kind == "gcn":
            kept += (n_in * d_out + (e + n_in) * (d_out + 2)) * f32
            layer_transient = (e + n_in) * d_out * f32
        else:  # sage
            kept += (n_out * d_in + 2 * n_out * d_out) * f32
            layer_transient = e * d_in * f32
        if i < layers - 1:
            kept += 3 * n_out * d_out * f32  # ReLU, dropout's output and its mask (counted as float32: a margin)
        transient = max(transient, layer_transient)
    params = sum(dims[i] * dims[i + 1] * 2 + dims[i + 1] for i in range(layers)) * f32
    # weights, gradients, Adam's two moments; the activations with ACTIVATION_MARGIN for what the count misses
    return batch + int(ACTIVATION_MARGIN * (kept + transient)) + 4 * params + model.device_overhead


@dataclass(frozen=True)
class GroupChoice:
    """The groups picked for a batch, their count, the estimate of the largest micro-batch and, for K > 1,
    the micro-batches themselves (estimating cut them already: the loop trains these, not a second cut)."""

    groups: Tensor
    k: int
    largest_bytes: int
    parts: list[MicroBatch] | None = None


def choose_groups(batch: Batch, budget: int, model: ModelShape, seed: int = 0, max_k: int = 64) -> GroupChoice:
    """The fewest REG + METIS groups whose largest micro-batch the estimate puts under ``budget`` bytes
    (K = 1 when the whole batch fits). Raises ``MemoryError`` naming the budget needed when even ``max_k``
    micro-batches (or one seed each) would not fit."""
    seeds = batch.num_sampled_nodes[0]
    whole = estimate_bytes(batch.num_sampled_nodes, batch.num_sampled_edges, model)
    if whole <= budget:
        return GroupChoice(torch.zeros(seeds, dtype=torch.long), 1, whole)
    k = 2
    limit = min(max_k, seeds)
    while True:
        k = min(k, limit)
        groups = reg_groups(batch, k, seed)
        parts = split_batch(batch, groups)
        largest = max(estimate_bytes(p.batch.num_sampled_nodes, p.batch.num_sampled_edges, model) for p in parts)
        if largest <= budget:
            return GroupChoice(groups, k, largest, parts)
        if k == limit:
            raise MemoryError(f"a batch of {seeds} seeds needs about {largest / 2**20:.0f} MiB per micro-batch even "
                              f"split {k} ways; --device-memory is {budget / 2**20:.0f} MiB")
        k *= 2


AUTO_MEMORY_SHARE = 0.9
"""Share of a CUDA device's free memory ``--micro-batches auto`` gives a step (the rest: the caching allocator's
fragmentation and what other processes take meanwhile)."""


def free_device_memory(device: torch.device) -> int:
    """``--micro-batches auto``'s budget: ``AUTO_MEMORY_SHARE`` of ``device``'s free memory now; a one-line
    ``UserError`` on a device without one to measure (the CPU)."""
    if device.type != "cuda":
        raise UserError("--micro-batches auto sizes micro-batches to a CUDA device's free memory; on the CPU give "
                        "--device-memory SIZE or --micro-batches K")
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * AUTO_MEMORY_SHARE)


class MicroBatching:
    """The training loop's split policy: a fixed ``k`` (``--micro-batches``), the fewest micro-batches under
    ``budget`` bytes (``--device-memory``), or none (both None). Counts what it split since ``take_stats``."""

    def __init__(self, k: int | None, budget: int | None, model: ModelShape, seed: int = 0) -> None:
        self.k, self.budget, self.model, self.seed = k, budget, model, seed
        self.batches = self.micro_batches = 0
        self.input_rows = self.batch_rows = 0

    @property
    def enabled(self) -> bool:
        """Whether batches may be cut at all (``--micro-batches`` above 1, or ``--device-memory``)."""
        return (self.k is not None and self.k > 1) or self.budget is not None

    def split(self, batch: Batch) -> list[MicroBatch] | None:
        """``batch``'s micro-batches, or None to train it whole. Raises ``UserError`` when ``--device-memory``
        cannot be met."""
        if self.k is not None and self.k > 1:
            # the daemon's groups where it made them (the same REG + METIS, off the training path)
            groups = reg_groups(batch, self.k, self.seed) if batch.seed_group is None else batch.seed_group.long()
            parts = split_batch(batch, groups)
        elif self.budget is not None:
            try:
                choice = choose_groups(batch, self.budget, self.model, self.seed)
            except MemoryError as err:
                raise UserError(f"--device-memory: {err}") from None
            if choice.parts is None:
                return None
            parts = choice.parts
        else:
            return None
        self.batches += 1
        self.micro_batches += len(parts)
        self.input_rows += sum(p.batch.x.shape[0] for p in parts)
        self.batch_rows += batch.x.shape[0]
        return parts

    def take_stats(self) -> tuple[int, int, float]:
        """(batches split, their micro-batches, input rows over the batches' rows) since the last call."""
        stats = (self.batches, self.micro_batches, self.input_rows / self.batch_rows if self.batch_rows else 1.0)
        self.batches = self.micro_batches = self.input_rows = self.batch_rows = 0
        return stats


def measure_step_bytes(model: torch.nn.Module, batch: Batch, optimizer: torch.optim.Optimizer | None = None) -> int:
    """The measured peak of one training step (forward, backward and, given ``optimizer``, its step) of
    ``model`` on ``batch``, in the terms ``estimate_bytes`` predicts: on CUDA ``max_memory_allocated`` (the
    batch, the model and every tensor the step made); on the CPU the profiler's memory timeline of the tensors
    the step made, plus the batch's tensors and the weights, gradients and Adam moments it cannot see made.
    For checking the estimate (tests, bench/micro_batch_bench.py), not for training."""
    device = batch.x.device

    def step() -> None:
        model.zero_grad(set_to_none=True)
        out = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges, batch.x_agg)
        torch.nn.functional.cross_entropy(out, batch.y, weight=batch.class_weight, ignore_index=-1,
                                          reduction="sum").backward()
        if optimizer is not None:
            optimizer.step()

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    before = sum(t.numel() * t.element_size() for t in (batch.x, batch.y, batch.edge_index, batch.n_id))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    # Adam's moments: there before the step if an earlier step made them (the timeline does not see them then)
    state = sum(t.numel() * t.element_size() for entry in optimizer.state.values() for t in entry.values()
                if isinstance(t, torch.Tensor)) if optimizer is not None else 2 * params
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        step()
    live = peak = 0
    # private, but the profiler's memory timeline is exactly what is wanted: every tensor created and destroyed
    for _, action, _, size in prof._memory_profile().timeline:
        live += size if action.name == "CREATE" else -size if action.name == "DESTROY" else 0
        peak = max(peak, live)
    return before + params + state + peak
