"""The optimizer of the training loops (node and link): Adam, with torch's fused kernel where the device has one.

On the CPU torch's default Adam runs a loop of small ops per parameter tensor; its fused kernel makes one pass.
A bag-of-words input layer makes that matter: on coauthor-physics (8,415 columns) layer 0's two weights are
2.2 M floats, and Adam's step on the link model took 13.0 ms with the default kernel against 2.3 ms fused, beside a
forward and backward of 75 ms (bench/optimizer_bench.py; docs/PERFORMANCE.md, "Adam's step"). The update is the
same to float32 rounding (tested).

A run resumed from a checkpoint keeps the kernel it was checkpointed with (``load_state_dict`` restores the
param groups, ``fused`` among them), so a resumed run still ends bitwise where the uninterrupted one would.
"""

from collections.abc import Iterable

import torch

__all__ = ["adam"]


def adam(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam over ``params`` (already on their device), fused where torch has the kernel for it."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True)
    except RuntimeError:  # a device without a fused kernel, or torch < 2.4 on the CPU
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
