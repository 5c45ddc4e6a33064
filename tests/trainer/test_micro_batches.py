"""Betty's micro-batches (``trainer.micro_batches``): the split against a plain reference, the accumulated gradient
against the whole batch's (SAGE, GCN, GAT), REG + METIS against a random split, and ``--device-memory`` against
the peak the CPU profiler measures."""

from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.errors import UserError
from trainer.batch import Batch
from trainer.micro_batches import (
    MicroBatching,
    ModelShape,
    choose_groups,
    estimate_bytes,
    measure_step_bytes,
    random_groups,
    redundancy,
    reg_groups,
    split_batch,
)
from trainer.models import build_model
from trainer.records import TrainConfig


def random_batch(seeds: int, hop_nodes: list[int], hop_edges: list[int], dim: int, generator: torch.Generator,
                 classes: int = 4) -> Batch:
    """A batch in PyG's layout: hop-h edges target hop-(h-1) nodes; their sources are nodes of hops <= h, every
    node first reached at hop h among them (that is what reaching it means)."""
    nsn = [seeds]
    for n in hop_nodes:  # nothing is reached beyond a hop that reached nothing
        nsn.append(n if nsn[-1] else 0)
    offsets = [0]
    for n in nsn:
        offsets.append(offsets[-1] + n)
    sources, targets = [], []
    for h, extra in enumerate(hop_edges, start=1):
        lo, hi = offsets[h - 1], offsets[h]  # the targets: hop h-1
        new = torch.arange(offsets[h], offsets[h + 1])
        extra = extra if hi > lo else 0
        count = new.shape[0] + extra
        src = torch.cat([new, torch.randint(0, offsets[h + 1], (extra,), generator=generator)])
        tgt = torch.randint(lo, hi, (count,), generator=generator) if count else torch.zeros(0, dtype=torch.long)
        perm = torch.randperm(count, generator=generator)
        sources.append(src[perm])
        targets.append(tgt[perm])
    edge_index = torch.stack([torch.cat(sources), torch.cat(targets)])
    nodes = offsets[-1]
    return Batch(torch.randn(nodes, dim, generator=generator), torch.randint(0, classes, (seeds,), generator=generator),
                 edge_index, torch.randperm(10 * nodes, generator=generator)[:nodes], nsn,
                 [int(s.shape[0]) for s in sources])


def reference_parts(batch: Batch, groups: list[int]):
    """Per group: the full-batch node ids of each level and the full-batch (source, target) pairs of each hop."""
    src, dst = batch.edge_index.tolist()
    in_edges = defaultdict(list)
    for e, t in enumerate(dst):
        in_edges[t].append(e)
    for g in sorted(set(groups)):
        level = [s for s, group in enumerate(groups) if group == g]
        seen, levels, hops = set(level), [sorted(level)], []
        for _ in batch.num_sampled_edges:
            edges = [e for v in level for e in in_edges[v]]
            new = sorted({src[e] for e in edges} - seen)
            seen.update(new)
            levels.append(new)
            hops.append(sorted((src[e], dst[e]) for e in edges))
            level = new
        yield levels, hops


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(0, 15), min_size=1, max_size=3), st.integers(0, 30),
       st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_each_micro_batch_is_its_seeds_receptive_field_in_the_layout(seeds, hop_nodes, extra, k, seed):
    generator = torch.Generator().manual_seed(seed)
    batch = random_batch(seeds, hop_nodes, [extra] * len(hop_nodes), 3, generator)
    groups = torch.randint(0, k, (seeds,), generator=generator)
    parts = split_batch(batch, groups)
    want = list(reference_parts(batch, groups.tolist()))
    assert len(parts) == len(want) == len(set(groups.tolist()))
    position = {int(v): i for i, v in enumerate(batch.n_id)}
    for part, (levels, hops) in zip(parts, want, strict=True):
        b = part.batch  # Batch.__post_init__ already checked the layout's sizes
        full = torch.tensor([position[int(v)] for v in b.n_id])  # each micro-batch node's id in the batch
        assert b.num_sampled_nodes == [len(level) for level in levels]
        assert sorted(part.seeds.tolist()) == levels[0] and torch.equal(full[:len(levels[0])], part.seeds)
        start = 0
        for n, level in zip(b.num_sampled_nodes, levels, strict=True):
            assert sorted(full[start:start + n].tolist()) == level
            start += n
        assert torch.equal(b.x, batch.x[full]) and torch.equal(b.y, batch.y[part.seeds])
        start = 0
        for count, pairs in zip(b.num_sampled_edges, hops, strict=True):
            local = b.edge_index[:, start:start + count]
            assert sorted(zip(full[local[0]].tolist(), full[local[1]].tolist())) == pairs
            start += count


def real_shaped_batch(seed: int = 0) -> Batch:
    # 1024 seeds, [10, 5]-like fan: the sizes of a real batch at small width
    return random_batch(256, [900, 1500], [1600, 3000], 48, torch.Generator().manual_seed(seed), classes=6)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("split", ["reg", "random"])
def test_the_accumulated_gradient_and_the_logits_are_the_whole_batchs(kind, split):
    batch = real_shaped_batch()
    torch.manual_seed(0)
    model = build_model(kind, 48, 32, 6, 2, dropout=0.0)
    logits = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    F.cross_entropy(logits, batch.y).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    groups = reg_groups(batch, 3) if split == "reg" else random_groups(256, 3, torch.Generator().manual_seed(1))
    parts = split_batch(batch, groups)
    assert len(parts) == 3
    got_logits = torch.empty_like(logits)
    for part in parts:
        b = part.batch
        out = model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
        (F.cross_entropy(out, b.y, reduction="sum") / batch.batch_size).backward()
        got_logits[part.seeds] = out.detach()
    torch.testing.assert_close(got_logits, logits.detach(), rtol=1e-5, atol=1e-5)
    for w, p in zip(want, model.parameters(), strict=True):
        # float32 sums in another order: relative 1e-5 of the gradient's scale (measured: under 1e-6)
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-5 * float(w.abs().max()))


def test_reg_metis_loads_fewer_input_nodes_than_a_random_split():
    batch = real_shaped_batch(3)
    for k in (2, 4, 8):
        reg = redundancy(split_batch(batch, reg_groups(batch, k)), batch)
        rand = redundancy(split_batch(batch, random_groups(256, k, torch.Generator().manual_seed(k))), batch)
        assert 1.0 <= reg < rand, (k, reg, rand)


def test_reg_groups_are_balanced_and_cover_every_seed():
    batch = real_shaped_batch(4)
    groups = reg_groups(batch, 4)
    counts = torch.bincount(groups, minlength=4)
    assert counts.sum() == 256 and counts.min() > 0 and counts.max() <= 1.1 * 64
    assert torch.equal(reg_groups(batch, 1), torch.zeros(256, dtype=torch.long))


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_device_memory_picks_a_split_whose_measured_peak_fits_a_budget_the_whole_batch_does_not(kind):
    batch = real_shaped_batch(5)
    torch.manual_seed(0)
    model = build_model(kind, 48, 64, 6, 2, dropout=0.0)
    shape = ModelShape(kind, 48, 64, 6, 2)
    whole_measured = measure_step_bytes(model, batch)
    whole_estimate = estimate_bytes(batch.num_sampled_nodes, batch.num_sampled_edges, shape)
    assert whole_estimate >= whole_measured  # the estimate errs on the safe side
    budget = int(0.55 * whole_measured)  # the whole batch does not fit
    choice = choose_groups(batch, budget, shape)
    assert choice.k >= 2 and choice.largest_bytes <= budget
    for part in split_batch(batch, choice.groups):
        assert measure_step_bytes(model, part.batch) <= budget


def test_an_unreachable_budget_and_conflicting_options_are_one_line_errors():
    batch = real_shaped_batch(6)
    policy = MicroBatching(None, 1 << 10, ModelShape("sage", 48, 64, 6, 2))
    with pytest.raises(UserError, match="--device-memory: .* needs about .* MiB per micro-batch"):
        policy.split(batch)
    with pytest.raises(UserError, match="not both"):
        TrainConfig(micro_batches=2, device_memory=1 << 30)
    with pytest.raises(UserError, match="micro_batches must be positive"):
        TrainConfig(micro_batches=0)


def test_training_with_micro_batches_follows_the_whole_batch_run(dataset_1500):
    from trainer.inmemory_source import InMemorySource
    from trainer.loop import train

    source = InMemorySource(dataset_1500, batch_size=300, fanouts=(5, 5), eval_batch_size=1000, seed=3)
    common = {"hidden": 16, "epochs": 2, "dropout": 0.0, "seed": 1, "device": "cpu"}
    whole = train(source, TrainConfig(**common))
    lines: list[str] = []
    split = train(source, TrainConfig(micro_batches=3, **common), log=lines.append)
    # the same updates up to float rounding: the same losses and scores
    assert [r.loss for r in split.epochs] == pytest.approx([r.loss for r in whole.epochs], rel=1e-4)
    assert [r.val_acc for r in split.epochs] == pytest.approx([r.val_acc for r in whole.epochs], abs=2e-3)
    record = split.epochs[-1]
    assert record.split_batches == record.batches and record.micro_batches == 3 * record.batches
    assert record.input_redundancy >= 1.0 and "micro-batches 3.0/batch (redundancy " in lines[-1]
    assert whole.epochs[-1].split_batches == 0


def test_micro_batches_auto_needs_a_cuda_device_and_says_so_in_one_line(dataset_1500):
    import subprocess
    import sys

    from trainer.micro_batches import free_device_memory

    with pytest.raises(UserError, match="--micro-batches auto sizes micro-batches to a CUDA device's free memory"):
        free_device_memory(torch.device("cpu"))
    done = subprocess.run([sys.executable, "-m", "trainer", "--mode", "inmemory", "--dataset", str(dataset_1500),
                           "--epochs", "1", "--device", "cpu", "--micro-batches", "auto"], capture_output=True,
                          text=True)
    assert done.returncode != 0 and "CUDA device's free memory" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    bad = subprocess.run([sys.executable, "-m", "trainer", "--socket", "/nonexistent.sock", "--micro-batches", "0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--micro-batches" in bad.stderr
