"""Betty's micro-batches on real batches: redundancy of REG + METIS against a random split, and the memory
estimate against the measured peak (`trainer/micro_batches.py`).

Per graph (the shared graphs, prepared with METIS into ``--partitions`` partitions under ``--work``, and/or a
graph generated with ``--generate NODES``): the first ``--batches`` training batches of epoch 0 (batch 1024,
fanouts [10, 5], in-memory sampling), then

  - redundancy (input nodes summed over the micro-batches / the batch's input nodes) for K in ``--ks``, split
    by REG + METIS and at random, mean over the batches, and the seconds REG + METIS takes per batch;
  - per model (GraphSAGE, GCN, GAT; hidden 256, 2 layers) the estimate and the measured peak of a training
    step (with Adam) on the whole first batch and on the largest of its K = 4 REG micro-batches: on CUDA
    ``max_memory_allocated``, on the CPU the profiler's memory timeline (``measure_step_bytes``);
  - on CUDA, on the last graph: ``train`` with whole batches, then with ``device_memory`` = half their peak
    (``--budget-steps`` steps each): the measured peak against that budget.

Writes ``<out>/micro-batches.{json,md}`` (default bench/results).

    .venv/bin/python bench/micro_batch_bench.py [--datasets cora-planetoid,...] [--generate 200000] [--device auto]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.accuracy_bench import DATASETS, SHARED, prepare
from bench.harness import RESULTS, generated_dataset, machine_description
from trainer.inmemory_source import InMemorySource
from trainer.micro_batches import (
    CUDA_STEP_OVERHEAD,
    ModelShape,
    estimate_bytes,
    measure_step_bytes,
    random_groups,
    redundancy,
    reg_groups,
    split_batch,
)
from trainer.models import build_model


def graph_rows(name: str, dataset: Path, args: argparse.Namespace, device: torch.device) -> dict[str, object]:
    source = InMemorySource(dataset, batch_size=1024, fanouts=(10, 5), seed=0)
    info = source.info
    batches = []
    for batch in source.train_batches(0):
        batches.append(batch)
        if len(batches) == args.batches:
            break
    split: dict[str, dict[str, float]] = {}
    for k in args.ks:
        reg, rand, seconds = [], [], []
        for i, batch in enumerate(batches):
            t0 = time.perf_counter()
            groups = reg_groups(batch, k)
            seconds.append(time.perf_counter() - t0)
            reg.append(redundancy(split_batch(batch, groups), batch))
            rand.append(redundancy(split_batch(batch, random_groups(batch.batch_size, k,
                                                                    torch.Generator().manual_seed(i))), batch))
        split[str(k)] = {"reg": statistics.mean(reg), "random": statistics.mean(rand),
                         "reg_seconds": statistics.mean(seconds)}
    first = batches[0]
    parts = split_batch(first, reg_groups(first, 4))
    largest = max(parts, key=lambda p: p.batch.x.shape[0]).batch
    memory: dict[str, dict[str, int]] = {}
    for kind in args.models:
        torch.manual_seed(0)
        model = build_model(kind, info.num_features, 256, info.num_classes, 2, 0.5).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
        shape = ModelShape(kind, info.num_features, 256, info.num_classes, 2,
                           device_overhead=CUDA_STEP_OVERHEAD if device.type == "cuda" else 0)
        row: dict[str, int] = {}
        for label, batch in (("whole", first), ("k4_largest", largest)):
            on_device = batch.to(device)
            measure_step_bytes(model, on_device, optimizer)  # Adam's moments exist from here on, as in training
            row[f"{label}_measured"] = measure_step_bytes(model, on_device, optimizer)
            row[f"{label}_estimate"] = estimate_bytes(batch.num_sampled_nodes, batch.num_sampled_edges, shape)
        memory[kind] = row
        del model, optimizer
    print(f"{name}: {json.dumps({'split': split, 'memory': memory})}", flush=True)
    return {"graph": name, "nodes_per_hop": first.num_sampled_nodes, "features": info.num_features,
            "split": split, "memory": memory}


def budget_check(dataset: Path, device: torch.device, steps: int) -> dict[str, object]:
    """``megabatch train --device-memory`` on CUDA: the peak of whole batches, then a budget of half of it."""
    from trainer.loop import train
    from trainer.records import TrainConfig

    source = InMemorySource(dataset, batch_size=1024, fanouts=(10, 5), seed=0)
    common = {"epochs": 1, "max_steps": steps, "device": device.type, "seed": 0}
    whole = train(source, TrainConfig(**common)).epochs[-1]
    budget = whole.peak_device_bytes // 2
    split = train(source, TrainConfig(device_memory=budget, **common)).epochs[-1]
    out = {"whole_peak": whole.peak_device_bytes, "budget": budget, "split_peak": split.peak_device_bytes,
           "micro_per_batch": split.micro_batches / max(1, split.split_batches),
           "redundancy": split.input_redundancy, "whole_samples_per_s": whole.samples_per_s,
           "split_samples_per_s": split.samples_per_s}
    print(f"--device-memory check: {json.dumps(out)}", flush=True)
    return out


def markdown(rows: list[dict[str, object]], args: argparse.Namespace, device: str) -> str:
    mib = 2 ** 20
    lines = [f"# Micro-batches: REG + METIS vs random, estimate vs measured ({device})", "",
             f"{machine_description()}; first {args.batches} training batches (1024 seeds, [10, 5]); "
             "`bench/micro_batch_bench.py`.", "",
             "| graph | batch nodes per hop | K | redundancy REG + METIS | random | REG + METIS s/batch |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        for k, s in row["split"].items():  # type: ignore[attr-defined]
            lines.append(f"| {row['graph']} | {row['nodes_per_hop']} | {k} | {s['reg']:.3f} | {s['random']:.3f} | "
                         f"{s['reg_seconds']:.3f} |")
    lines += ["", "| graph | model | whole: estimate / measured (MiB) | ratio | largest of K = 4: estimate / "
              "measured (MiB) | ratio |", "|---|---|---|---|---|---|"]
    for row in rows:
        for kind, m in row["memory"].items():  # type: ignore[attr-defined]
            lines.append(f"| {row['graph']} | {kind} | {m['whole_estimate'] / mib:.1f} / "
                         f"{m['whole_measured'] / mib:.1f} | {m['whole_estimate'] / m['whole_measured']:.2f} | "
                         f"{m['k4_largest_estimate'] / mib:.1f} / "
                         f"{m['k4_largest_measured'] / mib:.1f} | "
                         f"{m['k4_largest_estimate'] / m['k4_largest_measured']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default=",".join(DATASETS), help="shared graphs (default all five; '' for none)")
    p.add_argument("--generate", type=int, default=0, help="also a generated graph of this many nodes (default 0)")
    p.add_argument("--feat-dim", type=int, default=256, help="features of the generated graph (default 256)")
    p.add_argument("--partitions", type=int, default=32)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--ks", default="2,4,8")
    p.add_argument("--models", default="sage,gcn,gat")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--budget-steps", type=int, default=30, help="steps of each --device-memory run (CUDA only)")
    p.add_argument("--work", type=Path, default=Path("/var/tmp/mb-micro"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    args.ks = [int(k) for k in args.ks.split(",")]
    args.models = args.models.split(",")
    name = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = torch.device("cpu" if name == "auto" else name)
    graphs: list[tuple[str, Path]] = []
    for graph in filter(None, args.datasets.split(",")):
        if not (SHARED / f"{graph}.npz").exists():
            raise SystemExit(f"bench: {SHARED / f'{graph}.npz'} is missing (pass --datasets '' and --generate N)")
        graphs.append((graph, prepare(graph, args.work, args.partitions)))
    if args.generate:
        (args.work / f"gen-{args.generate}").mkdir(parents=True, exist_ok=True)
        graphs.append((f"generated-{args.generate}", generated_dataset(args.work / f"gen-{args.generate}",
                                                                        args.generate, 15, args.feat_dim, 64,
                                                                        generate_budget=None, prepare_budget="4G")))
    rows = [graph_rows(graph, dataset, args, device) for graph, dataset in graphs]
    text = markdown(rows, args, str(device))
    check = None
    if device.type == "cuda" and graphs:
        check = budget_check(graphs[-1][1], device, args.budget_steps)
        mib = 2 ** 20
        text += (f"\n\n`--device-memory` on {graphs[-1][0]} ({args.budget_steps} steps, GraphSAGE 256): whole batches "
                 f"peak at {check['whole_peak'] / mib:.0f} MiB; with a budget of half that, "  # type: ignore[operator]
                 f"{check['micro_per_batch']:.1f} micro-batches per batch (redundancy {check['redundancy']:.2f}) "
                 f"peak at {check['split_peak'] / mib:.0f} MiB; samples/s {check['whole_samples_per_s']:,.0f} "
                 f"whole, {check['split_samples_per_s']:,.0f} split.")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "micro-batches.json").write_text(json.dumps({"machine": machine_description(), "device": str(device),
                                                             "args": settings, "graphs": rows,
                                                             "device_memory_check": check}, indent=2))
    (args.out / "micro-batches.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
