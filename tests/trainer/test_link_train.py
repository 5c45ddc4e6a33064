"""``megabatch train --task link`` on a small generated link dataset: output, determinism, resume, refusals."""

import json
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from loader.format.dataset import open_dataset
from loader.format.link import read_edge_buckets
from loader.offline.prepare import PrepareOptions, prepare_dataset
from loader.sampling.buffer_order import ASSIGNMENTS, LINK_ORDERS, buffer_plan
from loader.sampling.link_sampling import link_batch_plan, sample_link_batch
from loader.sampling.negative_weights import buffer_negative_weights
from proto.errors import UserError
from tests.graphs import link_input_graph, link_raw
from trainer.cli import main
from trainer.link.inmemory import LinkInMemorySource
from trainer.link.model import LinkModel
from trainer.link.options import DEFAULT_LINK_LR, LINK_ASSIGNMENTS
from trainer.link.options import LINK_ORDERS as FLAG_ORDERS
from trainer.link.ranking import LINK_METRICS

NODES = 300

EPOCH_LINE = re.compile(r"^epoch (\d)/3  loss \d+\.\d{3}  val mrr \d\.\d{3} auc \d\.\d{3}  \d+ positives/s  "
                        r"data-wait \d+\.\d%$")
FINAL_LINE = re.compile(r"^best val mrr \d\.\d{4} at epoch [123]: test mrr \d\.\d{4} hits@1 \d\.\d{4} "
                        r"hits@10 \d\.\d{4} hits@50 \d\.\d{4} auc \d\.\d{4}$")

TIMINGS = ("samples_per_s", "wait_s", "step_s", "data_wait", "train_s", "eval_s")


@pytest.fixture(scope="module")
def link_dataset(tmp_path_factory):
    """300 nodes, ~2,900 directed edges stored both ways (an undirected graph), 8 features, 20 negatives per
    held-out positive, 4 partitions."""
    root = tmp_path_factory.mktemp("link-train")
    src, dst = link_input_graph(5, NODES, 1200, symmetric=True)
    raw = link_raw(root / "raw", src, dst, NODES, feat_dim=8, undirected=True, eval_negatives=20)
    prepare_dataset(raw.path, root / "ds", PrepareOptions(num_partitions=4, memory_budget=256 << 20, progress=False))
    return root / "ds"


def link_args(dataset, *extra):
    return ["--mode", "inmemory", "--dataset", str(dataset), "--task", "link", "--hidden", "16", "--batch-size",
            "128", "--fanouts", "5,5", *map(str, extra)]


def in_process(capsys, *args):
    """``main`` in this process: (exit code, stdout lines, stderr lines that report an error)."""
    code = main(["-q", "--no-progress", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), [line for line in err.splitlines() if "error" in line]


def without_timings(result):
    """A JSON result less what depends on the clock (and on where the checkpoint went)."""
    result = dict(result, config={k: v for k, v in result["config"].items() if k not in ("checkpoint", "resume")})
    result["epochs"] = [{k: v for k, v in record.items() if k not in TIMINGS} for record in result["epochs"]]
    return result


def test_link_training_end_to_end(link_dataset, tmp_path):
    out, ckpt = tmp_path / "result.json", tmp_path / "ck.pt"
    # wide enough batches (1,000+ pairs x 64) that a gradient gathered by parallel threads would show in the bits
    wide = ("--hidden", 64, "--batch-size", 512, "--epochs", 3)
    run = subprocess.run([sys.executable, "-m", "trainer", *link_args(link_dataset, *wide, "--json-out", out,
                                                                     "--checkpoint", ckpt, "--no-progress")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert [EPOCH_LINE.match(line) is not None for line in lines[:3]] == [True] * 3, lines
    assert FINAL_LINE.match(lines[3]) and len(lines) == 4, lines
    assert "metric mrr (auto: link prediction" in run.stderr and "Traceback" not in run.stderr
    assert f"lr {DEFAULT_LINK_LR}: link prediction's default in the shuffled order" in run.stderr
    result = json.loads(out.read_text())
    link = open_dataset(link_dataset).manifest.link
    assert result["task"] == "link" and result["metric"] == "mrr" and result["device"] == "cpu"
    assert result["config"]["task"] == "link" and result["config"]["decoder"] == "dot"
    assert result["config"]["hidden"] == 64
    assert result["config"]["negatives"] == 1 and result["config"]["disjoint"] is False
    assert [r["epoch"] for r in result["epochs"]] == [1, 2, 3] and result["best_epoch"] in (1, 2, 3)
    assert [r["samples"] for r in result["epochs"]] == [link.train] * 3  # every training positive once an epoch
    assert all(tuple(r["val"]) == LINK_METRICS for r in result["epochs"])
    test = result["test_at_best"]
    assert tuple(test) == LINK_METRICS and all(0 <= value <= 1 for value in test.values())
    assert result["test_score_at_best"] == test["mrr"] and result["best_val_score"] == result["best_val"]["mrr"]
    best = result["epochs"][result["best_epoch"] - 1]
    assert best["test"] == test and best["val"] == result["best_val"]
    # 20 negatives: every positive is within the top 50 of its 21 candidates
    assert test["hits@50"] == 1.0 and test["hits@1"] <= test["hits@10"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt", "result.json"]

    # the same run in this process: the same result, timings aside
    again = tmp_path / "again.json"
    assert main(["-q", "--no-progress", *link_args(link_dataset, *wide, "--json-out", again)]) == 0
    assert without_timings(json.loads(again.read_text())) == without_timings(result)


@pytest.mark.parametrize("order", [(), ("--link-order", "comet", "--buffer-partitions", 2)],
                         ids=["shuffled", "comet"])
def test_resumed_run_ends_as_an_uninterrupted_one(link_dataset, tmp_path, capsys, order):
    # bench/link_bench.py resumes a run cut short from its checkpoint and reports it as the whole run
    straight, resumed, ckpt = tmp_path / "straight.json", tmp_path / "resumed.json", tmp_path / "ck.pt"
    options = ("--decoder", "mlp", "--negatives", 2, *order)
    assert in_process(capsys, *link_args(link_dataset, "--epochs", 3, "--json-out", straight, *options))[0] == 0
    assert in_process(capsys, *link_args(link_dataset, "--epochs", 2, "--checkpoint", ckpt, *options))[0] == 0
    code, lines, _ = in_process(capsys, *link_args(link_dataset, "--epochs", 3, "--checkpoint", ckpt, "--resume",
                                                   "--json-out", resumed, *options))
    assert code == 0
    first, second = json.loads(straight.read_text()), json.loads(resumed.read_text())
    assert second["resumed_from_epoch"] == 2 and second["metric_reason"].startswith("as in the checkpoint; auto")
    second.update(resumed_from_epoch=None, metric_reason=first["metric_reason"])
    assert without_timings(second) == without_timings(first)


def test_checkpoints_refuse_the_other_task(link_dataset, tmp_path, capsys):
    link_ckpt, node_ckpt = tmp_path / "link.pt", tmp_path / "node.pt"
    assert in_process(capsys, *link_args(link_dataset, "--epochs", 1, "--checkpoint", link_ckpt))[0] == 0
    # a link dataset keeps its labels and node split: a node run trains on it, and writes a node checkpoint
    assert in_process(capsys, "--mode", "inmemory", "--dataset", link_dataset, "--hidden", 16, "--epochs", 1,
                      "--checkpoint", node_ckpt)[0] == 0

    code, _, err = in_process(capsys, "--mode", "inmemory", "--dataset", link_dataset, "--hidden", 16,
                              "--checkpoint", link_ckpt, "--resume")
    assert code == 1 and err == [f"megabatch train: error: {link_ckpt}: a link prediction checkpoint cannot resume "
                                 "a node classification run (--task link wrote it; start a new run or resume with "
                                 "--task link)"], err
    code, _, err = in_process(capsys, *link_args(link_dataset, "--checkpoint", node_ckpt, "--resume"))
    assert code == 1 and len(err) == 1 and "a node classification checkpoint cannot resume a link prediction" in err[0]
    code, _, err = in_process(capsys, *link_args(link_dataset, "--checkpoint", link_ckpt, "--resume", "--decoder",
                                                 "mlp"))
    assert code == 1 and len(err) == 1 and "decoder 'dot' in the checkpoint, 'mlp' now" in err[0], err
    code, _, err = in_process(capsys, *link_args(link_dataset, "--checkpoint", link_ckpt, "--resume", "--metric",
                                                 "roc_auc"))
    assert code == 1 and len(err) == 1 and "judged by mrr, not roc_auc" in err[0], err


@pytest.mark.parametrize("model, extra", [
    ("gcn", ("--decoder", "mlp", "--negatives", 3, "--disjoint", "--metric", "hits@10")),
    ("gat", ("--heads", 2, "--metric", "roc_auc", "--eval-fanouts=-1,-1")),
])
def test_options_reach_the_run(link_dataset, tmp_path, capsys, model, extra):
    out = tmp_path / "r.json"
    code, lines, err = in_process(capsys, *link_args(link_dataset, "--epochs", 1, "--model", model, "--json-out", out,
                                                     *extra))
    assert code == 0 and not err, err
    result = json.loads(out.read_text())
    metric = extra[extra.index("--metric") + 1]
    assert result["metric"] == metric and result["config"]["model"] == model
    assert result["config"]["lr"] == DEFAULT_LINK_LR != 0.003  # not the node task's default
    assert result["best_val_score"] == result["best_val"][metric]
    assert lines[-1].startswith(f"best val {'auc' if metric == 'roc_auc' else metric} ")
    if "--disjoint" in extra:
        assert result["config"]["disjoint"] is True and result["config"]["negatives"] == 3


@pytest.mark.parametrize("args, fragment", [
    (["--socket", "s", "--task", "link", "--negatives", "2"], "--negatives: not with --task link through the daemon"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--metric", "accuracy"],
     "--metric accuracy: not a link-prediction metric"),
    (["--mode", "inmemory", "--dataset", "x", "--metric", "mrr"], "--metric mrr: a link-prediction metric"),
    (["--mode", "inmemory", "--dataset", "x", "--decoder", "mlp", "--disjoint"],
     "--decoder, --disjoint: link-prediction options (--task link)"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--negatives", "0"], "must be positive"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--link-order", "comet"],
     "--link-order comet needs --buffer-partitions C"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--buffer-partitions", "4"],
     "--buffer-partitions: buffer options (--link-order comet or beta)"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--link-order", "shuffled", "--logical-partitions",
      "4"], "--logical-partitions: buffer options"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--link-order", "beta", "--buffer-partitions", "4",
      "--logical-partitions", "4"], "--logical-partitions: BETA swaps physical partitions"),
    (["--mode", "inmemory", "--dataset", "x", "--link-order", "beta", "--buffer-partitions", "4"],
     "--link-order, --buffer-partitions: link-prediction options (--task link)"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--link-order", "marius"], "invalid choice"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--no-negative-weights"],
     "--negative-weights: buffer options (--link-order comet or beta)"),
    (["--mode", "inmemory", "--dataset", "x", "--negative-weights"],
     "--negative-weights: link-prediction options (--task link)"),
    (["--socket", "s", "--task", "link", "--negative-weights"], "--negative-weights: not with --task link through"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--micro-batches", "2", "--aggregation-cache"],
     "--micro-batches, --aggregation-cache: node-classification options so far (not --task link)"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--link-order", "comet", "--buffer-partitions", "0"],
     "--buffer-partitions"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--link-assignment", "bucket"],
     "--link-assignment: buffer options (--link-order comet or beta)"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--link-order", "beta", "--buffer-partitions", "4",
      "--link-assignment", "edge"], "--link-assignment: BETA trains each bucket in its first co-resident state"),
    (["--socket", "s", "--task", "link", "--link-assignment", "bucket"], "--link-assignment: not with --task link"),
    (["--mode", "inmemory", "--dataset", "x", "--link-assignment", "edge"],
     "--link-assignment: link-prediction options (--task link)"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--link-order", "comet", "--buffer-partitions", "4",
      "--link-assignment", "pair"], "invalid choice"),
    (["--mode", "inmemory", "--dataset", "x", "--ema", "0.9"], "--ema: link-prediction options (--task link)"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--ema", "1"], "expected a number in [0, 1), got 1"),
    (["--mode", "inmemory", "--dataset", "x", "--task", "link", "--ema", "fast"], "expected a number in [0, 1)"),
])
def test_bad_link_arguments_are_one_line(capsys, args, fragment):
    with pytest.raises(SystemExit) as exited:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and fragment in err and len(err.splitlines()) == 1, err


def test_node_datasets_are_refused(dataset_1500, capsys):
    code, _, err = in_process(capsys, *link_args(dataset_1500))
    assert code == 1 and len(err) == 1 and "a node-classification dataset; --task link needs one imported" in err[0]


def test_one_rank_of_one_is_the_single_process_and_two_ranks_share_each_global_batch(link_dataset):
    dataset = open_dataset(link_dataset)
    single = LinkInMemorySource(dataset, batch_size=64, seed=3)
    alone = LinkInMemorySource(dataset, batch_size=64, seed=3, rank=0, world_size=1)
    for a, b in zip(single.train_batches(0), alone.train_batches(0), strict=True):
        assert torch.equal(a.edge_label_index, b.edge_label_index) and torch.equal(a.graph.n_id, b.graph.n_id)
        assert b.global_positives is None
    pieces = [list(LinkInMemorySource(dataset, batch_size=32, seed=3, rank=r, world_size=2).train_batches(0))
              for r in (0, 1)]
    # one step per global batch on each rank
    assert len(pieces[0]) == len(pieces[1]) == -(-single.train_positives // 64)
    assert {b.stream_batches for piece in pieces for b in piece} == {len(pieces[0])}
    for whole, first, second in zip(single.train_batches(0), *pieces, strict=True):
        assert first.global_positives == second.global_positives == whole.positives
        assert first.positives + second.positives == whole.positives
        assert 0 <= first.positives - second.positives <= 1  # even pieces, the larger first (a short last batch too)
    # every training positive once an epoch, over both ranks (positives are the first B pairs of a batch)
    trained = [(int(b.graph.n_id[b.edge_label_index[0, i]]), int(b.graph.n_id[b.edge_label_index[1, i]]))
               for piece in pieces for b in piece for i in range(b.positives)]
    assert len(trained) == single.train_positives


def test_two_ranks_train_like_one_process_with_the_same_global_batch(link_dataset, tmp_path):
    results = {}
    for name, extra in (("ddp", ("--nproc-per-node", "2", "--batch-size", "64")), ("single", ("--batch-size", "128"))):
        out = tmp_path / f"{name}.json"
        args = [*link_args(link_dataset, "--epochs", "4", "--json-out", out, "-q", "--no-progress", "--device", "cpu"),
                *extra]  # the later --batch-size wins: 2 x 64 against 128 per step
        done = subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        results[name] = json.loads(out.read_text())
    positives = LinkInMemorySource(open_dataset(link_dataset), batch_size=128).train_positives
    ddp, single = results["ddp"]["epochs"], results["single"]["epochs"]
    assert [e["samples"] for e in ddp] == [positives] * 4  # both ranks' pieces counted, each positive once
    assert [e["batches"] for e in ddp] == [e["batches"] for e in single]  # one step per global batch
    # the same global batches, other negatives and neighbours on rank 1: the same descent, not the same bits
    assert ddp[-1]["loss"] < ddp[0]["loss"]
    for mine, theirs in zip(ddp, single, strict=True):
        assert abs(mine["loss"] - theirs["loss"]) < 0.1 * theirs["loss"], (mine["loss"], theirs["loss"])



def test_source_covers_the_splits(link_dataset):
    """Training batches hold every training positive once an epoch; evaluation embeds each held-out node once."""
    dataset = open_dataset(link_dataset)
    source = LinkInMemorySource(dataset, batch_size=50, negatives=2, fanouts=(3, 2), eval_batch_size=40, seed=3)
    train = dataset.read("train_edges", np.int64, 2)
    pairs: Counter[tuple[int, int]] = Counter()
    for batch in source.train_batches(4):
        labels = batch.edge_label.numpy()
        b = batch.positives
        assert labels.tolist() == [1.0] * b + [0.0] * (2 * b)
        ids = batch.graph.n_id[batch.edge_label_index].numpy()
        pairs.update(zip(ids[0, :b].tolist(), ids[1, :b].tolist()))
        np.testing.assert_array_equal(ids[0, b:], np.tile(ids[0, :b], 2))  # negatives corrupt the tail only
    assert pairs == Counter(zip(train[0].tolist(), train[1].tolist()))
    for split in ("val", "test"):
        held = source.held_out[split]
        edges, tails = dataset.read(f"{split}_edges", np.int64, 2), dataset.read(f"{split}_neg_tails", np.int64, 2)
        np.testing.assert_array_equal(held.nodes[held.src], edges[0])
        np.testing.assert_array_equal(held.nodes[held.dst], edges[1])
        np.testing.assert_array_equal(held.nodes[held.tails], tails)
        seeds = [batch.n_id[:batch.num_seeds] for batch in source.eval_batches(split)]
        np.testing.assert_array_equal(torch.cat(seeds).numpy(), held.nodes)


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_decoders_are_symmetric_and_broadcast(decoder):
    torch.manual_seed(0)
    model = LinkModel("sage", 4, 8, 2, 0.0, decoder=decoder)
    a, b = torch.randn(5, 8), torch.randn(5, 8)
    torch.testing.assert_close(model.decode(a, b), model.decode(b, a))
    tails = torch.randn(5, 3, 8)
    # one source against its K tails at once equals the pairs one by one
    torch.testing.assert_close(model.decode(a.unsqueeze(1), tails),
                               torch.stack([model.decode(a, tails[:, j]) for j in range(3)], dim=1))
    if decoder == "dot":
        torch.testing.assert_close(model.decode(a, b), (a * b).sum(1))


def test_a_checkpoint_without_a_task_is_a_node_checkpoint(link_dataset, tmp_path, capsys):
    """Checkpoints from before link prediction carry no task: they read as node checkpoints; an unknown task
    is refused in one line."""
    from trainer.checkpoint import load_checkpoint

    path = tmp_path / "ck.pt"
    assert in_process(capsys, "--mode", "inmemory", "--dataset", link_dataset, "--hidden", 16, "--epochs", 1,
                      "--checkpoint", path)[0] == 0
    data = torch.load(path, weights_only=True)
    assert data["task"] == "node"
    del data["task"]
    torch.save(data, path)
    assert load_checkpoint(path).task == "node"
    data["task"] = "edge"
    torch.save(data, path)
    code, _, err = in_process(capsys, *link_args(link_dataset, "--checkpoint", path, "--resume"))
    assert code == 1 and len(err) == 1 and "checkpoint of an unknown task 'edge'" in err[0], err


def test_max_steps_and_a_stop_request_cut_the_run_without_evaluating(link_dataset, tmp_path, capsys):
    out = tmp_path / "r.json"
    code, lines, _ = in_process(capsys, *link_args(link_dataset, "--epochs", 3, "--max-steps", 2, "--json-out", out))
    result = json.loads(out.read_text())
    assert code == 0 and lines == ["no evaluation ran (stopped at --max-steps 2)"], lines
    assert [(r["batches"], r["val"]) for r in result["epochs"]] == [(2, None)] and result["stopped_at_max_steps"]

    from trainer.link.loop import train_link
    from trainer.link.records import LinkConfig
    from trainer.records import StopControl, TrainConfig

    source = LinkInMemorySource(open_dataset(link_dataset), batch_size=64, fanouts=(3, 2))
    stopped = train_link(source, LinkConfig(TrainConfig(hidden=8, epochs=2, device="cpu")),
                         control=StopControl(requested=True))
    assert stopped.stopped_on_request and stopped.epochs == [] and stopped.best_epoch is None


# ---- partition buffer orders (--link-order comet|beta) ----

@pytest.mark.parametrize("order", ["comet", "beta"])
def test_buffer_orders_run_and_record_their_plan(link_dataset, tmp_path, capsys, order):
    out = tmp_path / "r.json"
    code, lines, err = in_process(capsys, *link_args(link_dataset, "--epochs", 2, "--link-order", order,
                                                     "--buffer-partitions", 2, "--json-out", out))
    assert code == 0 and not err and lines[-1].startswith("best val mrr "), (lines, err)
    result = json.loads(out.read_text())
    link = open_dataset(link_dataset).manifest.link
    assert result["config"]["link_order"] == order and result["config"]["buffer_partitions"] == 2
    assert result["config"]["logical_partitions"] is None
    assert result["config"]["negative_weights"] is True  # a buffer order weighs its negatives by default
    # COMET splits its buckets by default; BETA has no choice to record
    assert result["config"]["assignment"] == ("edge" if order == "comet" else None)
    # 4 partitions, 2 resident: COMET's default groups them into 4 logical ones of 1, 2 at a time
    assert result["buffer"] == {"order": order, "capacity": 2, "physical_partitions": 4, "logical_partitions": 4,
                                "logical_capacity": 2}
    for record in result["epochs"]:
        plan = buffer_plan(order, 4, 2, None, 0, record["epoch"])  # the sampler seed is 0 by default
        assert (record["buffer_states"], record["partition_loads"]) == (plan.num_states, plan.io_partitions)
        assert record["samples"] == link.train  # every training positive once an epoch


@pytest.mark.parametrize("order", ["comet", "beta"])
def test_buffer_batches_cover_the_edges_and_stay_in_the_buffer(link_dataset, order):
    dataset = open_dataset(link_dataset)
    source = LinkInMemorySource(dataset, batch_size=50, negatives=2, fanouts=(3, 2), seed=3, link_order=order,
                                buffer_partitions=2, disjoint=True)
    train = dataset.read("train_edges", np.int64, 2)
    for epoch in (1, 2):
        states = source.buffer_epoch(epoch).states
        state_of_batch = [state for state in states for _ in range(state.num_batches)]
        batches = list(source.train_batches(epoch))
        assert len(batches) == len(state_of_batch) == source.buffer_epoch(epoch).num_batches
        assert [b.stream_batches for b in batches] == [len(batches)] * len(batches)  # the progress bar's total
        pairs: Counter[tuple[int, int]] = Counter()
        for batch, state in zip(batches, state_of_batch):
            resident = set(state.resident_nodes().tolist())
            ids = batch.graph.n_id.numpy()
            # positives, negatives and every sampled neighbour are nodes of the buffer
            assert set(ids.tolist()) <= resident
            labelled = ids[batch.edge_label_index.numpy()]
            pairs.update(zip(labelled[0, :batch.positives].tolist(), labelled[1, :batch.positives].tolist()))
            np.testing.assert_array_equal(batch.graph.x.numpy(), source.data.features[ids])
        assert pairs == Counter(zip(train[0].tolist(), train[1].tolist()))


def test_bucket_assignment_trains_each_bucket_whole_in_one_state(link_dataset, tmp_path, capsys):
    dataset = open_dataset(link_dataset)
    settings = {"batch_size": 32, "fanouts": (3, 3), "seed": 4, "link_order": "comet", "buffer_partitions": 2}
    split = LinkInMemorySource(dataset, **settings).buffer_epoch(1)
    whole = LinkInMemorySource(dataset, assignment="bucket", **settings).buffer_epoch(1)
    buckets = read_edge_buckets(dataset, dataset.manifest.link, 4)
    bucket_of = np.searchsorted(buckets, np.arange(int(buckets[-1])), side="right") - 1

    def states_per_bucket(epoch):
        state_of = np.empty(len(bucket_of), dtype=np.int64)
        for state in epoch.states:
            state_of[state.order] = state.index
        return [len(set(state_of[bucket_of == b].tolist())) for b in np.unique(bucket_of).tolist()]

    assert sorted(whole.batches.order.tolist()) == sorted(split.batches.order.tolist()) == list(range(len(bucket_of)))
    assert set(states_per_bucket(whole)) == {1}
    assert max(states_per_bucket(split)) > 1  # the default spreads a bucket over its states
    with pytest.raises(UserError, match="assignment must be one of edge, bucket"):
        LinkInMemorySource(dataset, assignment="pair", **settings)
    out = tmp_path / "r.json"
    code, _, err = in_process(capsys, *link_args(link_dataset, "--epochs", 1, "--link-order", "comet",
                                                 "--buffer-partitions", 2, "--link-assignment", "bucket",
                                                 "--json-out", out))
    assert code == 0 and not err and json.loads(out.read_text())["config"]["assignment"] == "bucket"
    assert LINK_ASSIGNMENTS == ASSIGNMENTS  # the trainer's choices are the loader's


def test_the_shuffled_order_is_the_loaders_plan_over_the_whole_graph(link_dataset):
    """--link-order shuffled (the default) samples link_batch_plan's batches on the full graph, as before."""
    dataset = open_dataset(link_dataset)
    source = LinkInMemorySource(dataset, batch_size=64, negatives=2, fanouts=(3, 2), seed=1, link_order="shuffled")
    assert source.buffer is None and next(source.train_batches(1)).stream_batches == -(-source.train_positives // 64)
    plan = link_batch_plan(source.train_positives, 64, 1, 2)
    for b, batch in enumerate(source.train_batches(2)):
        positions, key = plan.batch(b)
        expected = sample_link_batch(source.data.graph, source.train_edges[0, positions],
                                     source.train_edges[1, positions], source.num_nodes, (3, 2), key,
                                     negatives_per_positive=2)
        np.testing.assert_array_equal(batch.graph.n_id.numpy(), expected.nodes)
        np.testing.assert_array_equal(batch.graph.edge_index.numpy(), expected.edge_index)
        np.testing.assert_array_equal(batch.edge_label_index.numpy(), expected.edge_label_index)
    assert LINK_ORDERS == FLAG_ORDERS  # the parser takes the protocol's names, to stay clear of the loader's imports


@pytest.mark.parametrize("extra, fragment", [
    (("--link-order", "comet", "--buffer-partitions", 4), "--buffer-partitions 4: a buffer must hold at least 2 and "
                                                          "fewer than the dataset's 4 partitions"),
    (("--link-order", "beta", "--buffer-partitions", 1), "--buffer-partitions 1: a buffer must hold at least 2"),
    (("--link-order", "comet", "--buffer-partitions", 2, "--logical-partitions", 2),
     "--logical-partitions 2: l=2 logical partitions of up to 2 physical ones"),
])
def test_a_buffer_the_dataset_cannot_take_is_one_line(link_dataset, capsys, extra, fragment):
    code, _, err = in_process(capsys, *link_args(link_dataset, "--epochs", 1, *extra))
    assert code == 1 and len(err) == 1 and fragment in err[0], err


@pytest.mark.parametrize("served, order", [
    ({"loader": {"mode": "exact"}}, ()),
    ({"loader": {"mode": "hierarchical"}, "hierarchy": {"megabatch_fraction": 0.5}, "link": {"order": "comet"}},
     ("--link-order", "comet", "--buffer-partitions", "2")),
])
def test_two_ranks_through_the_daemon_train_what_two_ranks_in_memory_train(link_dataset, tmp_path, served, order):
    # the daemon deals each rank the in-memory rank's pieces, in the shuffled order (exact) and in COMET's
    # (hierarchical, a buffer of 2 of 4 partitions; tests/loader/daemon/test_link_serving.py): the same steps, so
    # the same losses and scores
    from tests.daemon_harness import daemon_config, running_daemon

    common = ["--task", "link", "--hidden", "16", "--epochs", "2", "-q", "--no-progress", "--device", "cpu",
              "--nproc-per-node", "2"]
    config = daemon_config(link_dataset, tmp_path / "s.sock",
                           sampler={"batch_size": 64, "fanouts": [5, 5], "eval_fanouts": [5, 5],
                                    "eval_batch_size": 1024, "seed": 0}, **served)
    results = {}
    runs = (("daemon", ["--socket", str(config.server.socket)]),
            ("memory", ["--mode", "inmemory", "--dataset", str(link_dataset), "--batch-size", "64", "--fanouts",
                        "5,5", *order]))
    with running_daemon(config):
        for name, source in runs:
            out = tmp_path / f"{name}.json"
            done = subprocess.run([sys.executable, "-m", "trainer", *source, *common, "--json-out", str(out)],
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
            results[name] = json.loads(out.read_text())
    # the record names the order the daemon served, and leaves what only its [link] config knows unsaid
    config = results["daemon"]["config"]
    assert config["link_order"] == results["memory"]["config"]["link_order"] == (order[1] if order else "shuffled")
    assert config["negative_weights"] is (None if order else False) and config["assignment"] is None
    daemon, memory = results["daemon"]["epochs"], results["memory"]["epochs"]
    assert [(e["samples"], e["batches"]) for e in daemon] == [(e["samples"], e["batches"]) for e in memory]
    for mine, reference in zip(daemon, memory, strict=True):
        for key in ("loss", "val_score"):
            assert mine[key] == pytest.approx(reference[key], abs=1e-5), key


def test_a_buffer_orders_negatives_carry_their_weights_and_weigh_the_loss(link_dataset, tmp_path, capsys):
    dataset = open_dataset(link_dataset)
    settings = {"batch_size": 50, "negatives": 2, "fanouts": (3, 2), "seed": 3, "link_order": "comet",
                "buffer_partitions": 2}
    weighted = LinkInMemorySource(dataset, negative_weights=True, **settings)
    plain = LinkInMemorySource(dataset, **settings)
    order = weighted.buffer_epoch(1)
    batch_state = np.repeat([s.index for s in order.states], [s.num_batches for s in order.states])
    for i, (mine, theirs) in enumerate(zip(weighted.train_batches(1), plain.train_batches(1), strict=True)):
        assert theirs.edge_weight is None
        assert torch.equal(mine.edge_label_index, theirs.edge_label_index)  # the same batches, weighted
        pairs = mine.graph.n_id.numpy()[mine.edge_label_index.numpy()]
        resident = len(order.states[batch_state[i]].resident_nodes())
        sizes = weighted.partitions.num_nodes
        want = buffer_negative_weights(weighted.partitions.partition_of(pairs), mine.positives, sizes,
                                       int(sizes.sum()), resident)
        assert mine.edge_weight.numpy().tobytes() == want.tobytes()
    with pytest.raises(UserError, match="--negative-weights: weighs a buffer order's negatives"):
        LinkInMemorySource(dataset, negative_weights=True, batch_size=50)
    # the loop weighs each pair's loss: the same run without the weights descends otherwise
    losses = {}
    for flag in ("--negative-weights", "--no-negative-weights"):
        out = tmp_path / f"{flag}.json"
        code, _, err = in_process(capsys, *link_args(link_dataset, "--epochs", 1, "--link-order", "comet",
                                                     "--buffer-partitions", 2, flag, "--json-out", out))
        assert code == 0 and not err, err
        result = json.loads(out.read_text())
        assert result["config"]["negative_weights"] is (flag == "--negative-weights")
        losses[flag] = result["epochs"][0]["loss"]
    assert losses["--negative-weights"] != losses["--no-negative-weights"]


def test_evaluation_runs_the_moving_average_of_the_weights(link_dataset, tmp_path, capsys):
    """The default --ema: every step updates the average, evaluation and the returned model are the average's, a
    checkpoint keeps it and a resume must keep averaging (or not) as the checkpointed run did."""
    from trainer.link.loop import train_link
    from trainer.link.options import DEFAULT_EMA
    from trainer.link.records import LinkConfig
    from trainer.records import TrainConfig

    dataset = open_dataset(link_dataset)

    def run(ema: float):
        source = LinkInMemorySource(dataset, batch_size=64, seed=3, fanouts=(3, 3))
        cfg = LinkConfig(TrainConfig(hidden=16, epochs=2, seed=5, device="cpu"), ema=ema)
        return train_link(source, cfg)

    averaged, last = run(DEFAULT_EMA), run(0.0)
    # the same steps: the live weights agree, the evaluated ones are the average's, a mix of every step's
    assert [r.loss for r in averaged.epochs] == [r.loss for r in last.epochs]
    assert averaged.epochs[-1].val != last.epochs[-1].val
    assert not all(torch.equal(a, b) for a, b in zip(averaged.model.state_dict().values(),
                                                     last.model.state_dict().values(), strict=True))
    assert json.loads(json.dumps(averaged.to_json()))["config"]["ema"] == DEFAULT_EMA
    # a checkpoint keeps the average; resuming it without one (or the other way round) is one line
    with_average, without = tmp_path / "a.pt", tmp_path / "b.pt"
    assert in_process(capsys, *link_args(link_dataset, "--epochs", 1, "--checkpoint", with_average))[0] == 0
    assert in_process(capsys, *link_args(link_dataset, "--epochs", 1, "--ema", 0, "--checkpoint", without))[0] == 0
    code, _, err = in_process(capsys, *link_args(link_dataset, "--epochs", 2, "--ema", 0, "--checkpoint",
                                                 with_average, "--resume"))
    assert code == 1 and len(err) == 1 and "checkpointed with a moving average of its weights" in err[0], err
    code, _, err = in_process(capsys, *link_args(link_dataset, "--epochs", 2, "--checkpoint", without, "--resume"))
    assert code == 1 and len(err) == 1 and "checkpointed without a moving average" in err[0], err
