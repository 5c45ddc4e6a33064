"""Adam's step on the trainer's models, torch's default (single-tensor) kernel against its foreach and fused ones,
side by side: milliseconds per ``optimizer.step()`` and the ratios to the default (trainer/optimizer.py picks
fused).

The models are the trainer's (GraphSAGE, 2 layers, hidden 128): a link model with its MLP decoder, and a node
classifier of 16 classes, at the input widths of the graphs they train on (default: coauthor-physics' 8,415
bag-of-words columns, coauthor-cs' 6,805, Cora's 1,433 and bench/compare's 256). The gradients are seeded normal
draws; each kernel takes ``--warmup`` steps untimed, then the kernels alternate, ``--repeats`` rounds of
``--steps`` steps each, and the table gives each kernel's mean. Each kernel's weights after the same steps are
checked equal (to float32 rounding) to the default's before anything is timed. Threads: ``--threads``
(default 1, as the benches that train run; the trainer uses every core it is given).

    .venv/bin/python bench/optimizer_bench.py [--widths 8415,6805,1433,256] [--steps 20] [--repeats 3]

Prints a markdown table; nothing is written.
"""

import argparse
import sys
import time

import torch

from trainer.link.model import LinkModel
from trainer.models import build_model

KERNELS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}
"""The ``torch.optim.Adam`` keyword of each kernel compared; "default" is what ``Adam(params)`` runs on the CPU."""


def _model(task: str, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if task == "link":
        return LinkModel("sage", width, 128, 2, 0.5, decoder="mlp")
    return build_model("sage", width, 128, 16, 2, 0.5)


def _optimizers(task: str, width: int) -> dict[str, tuple[torch.optim.Adam, list[torch.nn.Parameter]]]:
    made = {}
    for name, kwargs in KERNELS.items():
        params = list(_model(task, width).parameters())
        generator = torch.Generator().manual_seed(1)
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)
        made[name] = (torch.optim.Adam(params, lr=3e-3, weight_decay=5e-4, **kwargs), params)
    return made


def _check_equal(made: dict[str, tuple[torch.optim.Adam, list[torch.nn.Parameter]]], warmup: int) -> None:
    for opt, _ in made.values():
        for _ in range(warmup):
            opt.step()
    reference = made["default"][1]
    for name, (_, params) in made.items():
        for ours, theirs in zip(params, reference, strict=True):
            if not torch.allclose(ours, theirs, atol=1e-6, rtol=1e-5):
                raise SystemExit(f"optimizer_bench: the {name} kernel's weights differ from the default's")


def _time(opt: torch.optim.Adam, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - started) / steps


def _widths(text: str) -> list[int]:
    try:
        widths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"widths must be positive integers, got {text!r}") from None
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"widths must be positive integers, got {text!r}")
    return widths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=_widths, default=[8415, 6805, 1433, 256], help="input widths")
    parser.add_argument("--tasks", choices=["link", "node", "link,node", "node,link"], default="link,node")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed round (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per kernel (default 3)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats, args.threads) < 1 or args.warmup < 1:
        parser.error("--steps, --repeats, --warmup and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    names = list(KERNELS)
    print(f"Adam step, ms (mean of {args.repeats} x {args.steps} steps, {args.threads} thread(s); "
          f"GraphSAGE hidden 128; `bench/optimizer_bench.py`)\n")
    print("| model | input width | parameters | " + " | ".join(names) + " | "
          + " | ".join(f"default / {name}" for name in names[1:]) + " |")
    print("|---" * (3 + 2 * len(names) - 1) + "|")
    for task in args.tasks.split(","):
        for width in args.widths:
            made = _optimizers(task, width)
            _check_equal(made, args.warmup)
            seconds: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(args.repeats):  # alternate, so a slow spell of the machine falls on every kernel
                for name in names:
                    seconds[name].append(_time(made[name][0], args.steps))
            mean = {name: sum(values) / len(values) for name, values in seconds.items()}
            count = sum(param.numel() for param in made["default"][1])
            print(f"| {task} | {width:,} | {count:,} | " + " | ".join(f"{1e3 * mean[name]:.2f}" for name in names)
                  + " | " + " | ".join(f"{mean['default'] / mean[name]:.2f}x" for name in names[1:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
