"""The models on real sampled batches: shapes, trimming equals the full computation, gradients flow."""

from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.step_bench import coo_gcn_rows, pyg_pattern
from loader.sampling.sampling import CSCGraph, batch_keys, sample_pass
from trainer.models import MODELS, build_model, gcn_target_rows, mean_weights, target_rows


def _sampled_batch(seed: int, n: int, e: int, seeds: int, fanouts: list[int], width: int = 12):
    """A batch of ``seeds`` seeds sampled with ``fanouts`` from a random graph, as PyG-layout tensors."""
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, n, e))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
    graph = CSCGraph(indptr=indptr, indices=rng.integers(0, n, e), global_ids=np.arange(n, dtype=np.int64))
    batch = sample_pass(graph, rng.permutation(n)[:seeds], seeds, fanouts, batch_keys(0, 0, 0, 0, 0, 1)).batch(0)
    nodes, edges = batch.num_sampled_nodes.tolist(), batch.num_sampled_edges.tolist()
    x = torch.from_numpy(rng.standard_normal((len(batch.nodes), width)).astype(np.float32))
    return x, torch.from_numpy(batch.edge_index), nodes, edges


@pytest.fixture(scope="module")
def sampled():
    """A 2-hop batch of 32 seeds."""
    batch = _sampled_batch(0, 400, 4000, 32, [4, 3])
    nodes, edges = batch[2], batch[3]
    assert nodes[0] == 32 and nodes[2] > 0 and edges[1] > 0  # a real second hop to trim
    return batch


@pytest.fixture(scope="module")
def sampled_3hop():
    """A 3-hop batch of 16 seeds, for a model of three layers (two trims)."""
    batch = _sampled_batch(1, 500, 5000, 16, [3, 3, 2])
    nodes, edges = batch[2], batch[3]
    assert len(nodes) == 4 and min(nodes) > 0 and min(edges) > 0
    return batch


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("hops", [2, 3])
def test_the_edge_trim_is_pygs_trim_to_layer_bit_for_bit(sampled, sampled_3hop, name, hops):
    # training mode, dropout on: the same outputs and gradients as padding the rows back for trim_to_layer
    x, edge_index, nodes, edges = sampled if hops == 2 else sampled_3hop
    runs = []
    for forward in ("model", "pyg"):
        torch.manual_seed(0)
        model = build_model(name, 12, 16, 5, hops, 0.5).train()
        torch.manual_seed(1)  # the dropout masks
        out = (model(x, edge_index, nodes, edges) if forward == "model"
               else pyg_pattern(model, x, edge_index, nodes, edges))
        grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
        runs.append((out, grads))
    (out, grads), (want, want_grads) = runs
    assert torch.equal(out, want)
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(grads, want_grads, strict=True))


def _untrimmed(model, x, edge_index):
    """Every layer over the whole sampled subgraph, no trimming."""
    for i in range(model.num_layers):
        x = model.layer(i, x, edge_index)
        if i < model.num_layers - 1:
            x = F.relu(x)
    return x


@pytest.mark.parametrize("name", MODELS)
def test_output_is_one_row_of_logits_per_seed(sampled, name):
    x, edge_index, nodes, edges = sampled
    torch.manual_seed(0)
    model = build_model(name, 12, 16, 5, 2, 0.5)
    assert model(x, edge_index, nodes, edges).shape == (32, 5)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("hops", [2, 3])
def test_trimmed_equals_untrimmed_on_the_seeds(sampled, sampled_3hop, name, hops):
    x, edge_index, nodes, edges = sampled if hops == 2 else sampled_3hop
    torch.manual_seed(0)
    model = build_model(name, 12, 16, 5, hops, 0.5).eval()
    with torch.no_grad():
        trimmed = model(x, edge_index, nodes, edges)
        full = _untrimmed(model, x, edge_index)[: nodes[0]]
    assert trimmed.shape == (nodes[0], 5)
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_gradients_reach_every_parameter(sampled, name):
    x, edge_index, nodes, edges = sampled
    torch.manual_seed(0)
    model = build_model(name, 12, 16, 5, 2, 0.0)
    labels = torch.arange(32) % 5
    F.cross_entropy(model(x, edge_index, nodes, edges), labels).backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, pname


def test_hop_count_must_match_the_layers(sampled):
    x, edge_index, nodes, edges = sampled
    model = build_model("sage", 12, 16, 5, 3, 0.5)
    with pytest.raises(ValueError, match="2 sampled hops, the model 3 layers"):
        model(x, edge_index, nodes, edges)


def test_gat_hidden_width_is_split_across_heads():
    model = build_model("gat", 12, 16, 5, 2, 0.5, heads=4)
    assert model.convs[0].heads == 4 and model.convs[0].out_channels == 4 and model.convs[1].heads == 1
    edge_index = torch.tensor([[1, 2, 3], [0, 0, 1]])  # hop 1: 1->0, 2->0; hop 2: 3->1
    assert model(torch.zeros(4, 12), edge_index, [1, 2, 1], [2, 1]).shape == (1, 5)
    with pytest.raises(ValueError, match="multiple of heads"):
        build_model("gat", 12, 18, 5, 2, 0.5, heads=4)


def test_mean_weights_average_each_target_over_its_neighbours_and_itself():
    edges, weights = mean_weights(torch.tensor([[1, 2, 3], [0, 0, 1]]), 4)
    assert edges.shape == (2, 7)
    totals = torch.zeros(4).index_add_(0, edges[1], weights)
    torch.testing.assert_close(totals, torch.ones(4))
    torch.testing.assert_close(weights[:3], torch.tensor([1 / 3, 1 / 3, 1 / 2]))


def _pyg_layer_zero(model, x, edge_index, targets):
    """Layer 0 as PyG's own message passing computes it (the plain reference of ``input_layer``)."""
    conv = model.convs[0]
    if model.kind == "sage":
        return conv((x, x[:targets]), edge_index)
    edges, weights = mean_weights(edge_index, x.size(0))
    return conv(x, edges, weights)[:targets]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kind=st.sampled_from(["sage", "gcn"]), inputs=st.sampled_from(["dense", "sparse"]),
       order=st.sampled_from(["any", "by target"]))
def test_the_sparse_input_layer_equals_pyg_message_passing(data, kind, inputs, order):
    # any sampled-subgraph shape: repeated edges, targets without in-edges, no edges at all; sources past the
    # targets (the outermost hop), which send messages only, as trim_to_layer leaves them
    sources = data.draw(st.integers(1, 40), label="sources")
    targets = data.draw(st.integers(1, sources), label="targets")
    edges = data.draw(st.integers(0, 120), label="edges")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.stack([torch.randint(0, sources, (edges,), generator=gen),
                              torch.randint(0, targets, (edges,), generator=gen)])
    if order == "by target":  # as the samplers emit them: target_rows builds its CSR from them as they stand
        edge_index = edge_index[:, torch.argsort(edge_index[1], stable=True)]
    torch.manual_seed(seed)
    model = build_model(kind, 9, 6, 3, 2, 0.0)
    # input rows with any share of zeros, multiplied densely or as sparse rows (trainer/sparse_input.py) whatever
    # their density
    zeros = data.draw(st.floats(0.0, 1.0), label="zeros")
    x = torch.randn(sources, 9, generator=gen) * (torch.rand(sources, 9, generator=gen) >= zeros)
    want = _pyg_layer_zero(model, x, edge_index, targets)
    model.dense_inputs = inputs == "dense"
    with (mock.patch("trainer.models.max_sparse_entries", return_value=x.numel()),
          mock.patch.object(model, "sparse_input_layer", wraps=model.sparse_input_layer) as sparse_path):
        got = model.layer(0, x, edge_index, targets)
    assert sparse_path.called == (inputs == "sparse")  # the path asked for is the path taken
    assert got.shape == want.shape == (targets, 6)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    # and the same gradients for every parameter
    grads = [torch.autograd.grad(out.square().sum(), list(model.convs[0].parameters())) for out in (got, want)]
    for mine, reference in zip(*grads, strict=True):
        assert torch.allclose(mine, reference, atol=1e-4, rtol=1e-4)


def _edge_lists(data):
    """A layer's edges as drawn for the aggregation-matrix tests: (sources, num_targets, edges as (source, target)
    pairs, edge_index); repeated edges and targets past num_targets included, in target order (the samplers') or
    in any order."""
    sources = data.draw(st.integers(1, 12), label="sources")
    all_targets = data.draw(st.integers(1, sources), label="all_targets")
    num_targets = data.draw(st.integers(1, all_targets), label="num_targets")
    edges = data.draw(st.lists(st.tuples(st.integers(0, sources - 1), st.integers(0, all_targets - 1)),
                               max_size=40), label="edges")
    if data.draw(st.booleans(), label="by target"):
        edges = sorted(edges, key=lambda edge: edge[1])
    return sources, num_targets, edges, torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).t().contiguous()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_target_rows_is_the_summed_edge_matrix_in_either_layout(data):
    # edges by target (the samplers' order: CSR as they stand) or in any order (COO, coalesced): the dense matrix
    # of summed weights either way
    sources, num_targets, edges, edge_index = _edge_lists(data)
    weights = torch.rand(len(edges), generator=torch.Generator().manual_seed(len(edges)))
    want = torch.zeros(num_targets, sources)
    for e, (source, target) in enumerate(edges):
        if target < num_targets:
            want[target, source] += weights[e]
    got = target_rows(edge_index, weights, num_targets, sources)
    assert got.layout == (torch.sparse_csr if edges and edges == sorted(edges, key=lambda edge: edge[1])
                          else torch.sparse_coo)
    torch.testing.assert_close(got.to_dense(), want)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_gcns_matrix_is_the_mean_over_edges_and_self_loop_in_either_layout(data):
    # GCN's layer-0 matrix: built CSR from edges by target (self-loops placed at each row's end), else from the
    # self-loops appended (COO, as before); the dense matrix of mean_weights either way, and what the bench's old
    # variant builds
    sources, num_targets, edges, edge_index = _edge_lists(data)
    want = torch.zeros(num_targets, sources)
    degree = [1 + sum(1 for _, target in edges if target == t) for t in range(num_targets)]
    for source, target in [*edges, *((t, t) for t in range(num_targets))]:
        if target < num_targets:
            want[target, source] += 1.0 / degree[target]
    got = gcn_target_rows(edge_index, num_targets, sources, torch.float32)
    assert got.layout == (torch.sparse_csr if edges == sorted(edges, key=lambda edge: edge[1]) else torch.sparse_coo)
    torch.testing.assert_close(got.to_dense(), want)
    old = coo_gcn_rows(edge_index, num_targets, sources, torch.float32)
    assert old.layout == torch.sparse_coo
    torch.testing.assert_close(old.to_dense(), want)
