"""Several training processes (ranks) with torch.distributed: the process group's lifetime, the DDP
wrapper, and the few collectives the training loop needs besides DDP's gradient all-reduce.

Where this process stands (``trainer.ranks.Ranks``, from torchrun's environment) decides everything:
for a single process nothing here talks to anyone.

Every collective waits at most the process group's timeout (``--dist-timeout``) for the other ranks,
so a rank that died or hangs makes the others fail with one line (``peer_failure``) instead of
leaving them waiting forever. On CUDA the NCCL watchdog enforces the timeout by aborting the process.
"""

import datetime
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from proto.errors import UserError
from trainer.ranks import DEFAULT_TIMEOUT_S, Ranks

__all__ = ["training_device", "process_group", "data_parallel", "Peers", "peer_failure"]


def training_device(name: str, ranks: Ranks) -> torch.device:
    """``--device`` (auto, cpu or cuda) for this rank: several ranks on CUDA take GPU ``local_rank`` each."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device cuda requested but no CUDA device is available")
    if name != "cuda" or not ranks.distributed:
        return torch.device(name)
    count = torch.cuda.device_count()
    if ranks.local_rank >= count:
        raise UserError(f"LOCAL_RANK is {ranks.local_rank} but this machine has {count} CUDA "
                        "device(s): start at most one rank per GPU")
    return torch.device("cuda", ranks.local_rank)


def _first_sentence(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)  # gloo's "[/path/to/pair.cc:553] " source location
    head = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    return head[:300]


@contextmanager
def process_group(ranks: Ranks, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    """Join the other ranks (gloo on CPU, NCCL on CUDA) for the body and leave the group after it.
    Nothing for a single process. A rank that cannot reach the rendezvous, or whose peers do not all
    arrive within ``timeout_s``, is a UserError.

    After an error in the body the group is not torn down: the process is about to end (``megabatch
    train`` leaves with ``os._exit``, ``trainer.cli.exit_program``), and tearing down a group whose
    collective failed can deadlock (a gloo worker still finishing it needs the GIL that the group's
    destructor holds while it joins the worker). The kernel closes the connections at exit, which is
    what tells the other ranks."""
    if not ranks.distributed:
        yield
        return
    if timeout_s <= 0:
        raise UserError(f"--dist-timeout must be positive, got {timeout_s:g}")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    try:
        dist.init_process_group(backend, init_method="env://", rank=ranks.rank, world_size=ranks.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as err:  # DistError and the store's errors are RuntimeErrors
        raise UserError(f"could not join the {ranks.world_size} ranks at {where} within "
                        f"--dist-timeout {timeout_s:g} s ({_first_sentence(err)})") from None
    yield
    dist.destroy_process_group()


def data_parallel(model: torch.nn.Module, ranks: Ranks, device: torch.device) -> torch.nn.Module:
    """``model`` wrapped in DistributedDataParallel (which broadcasts rank 0's parameters now and averages
    gradients over the ranks in every backward); ``model`` itself for a single process."""
    if not ranks.distributed:
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


class Peers:
    """The training loop's collectives besides DDP's: sums, an agreed yes/no, gathers. For a single
    process each returns its input as is, so the loop reads the same either way. Every rank must
    make the same calls in the same order (each is a collective)."""

    def __init__(self, ranks: Ranks, device: torch.device) -> None:
        self.ranks = ranks
        self.device = device

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the ranks (a new tensor on ``values``'s device)."""
        if not self.ranks.distributed:
            return values
        total = values.to(self.device, copy=True)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.to(values.device)

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any: a decision all ranks take at the same point."""
        if not self.ranks.distributed:
            return flag
        return bool(self.sum(torch.tensor([int(flag)], dtype=torch.int64)).item())

    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Every rank's ``rows`` (CPU, same trailing shape and dtype, any number of rows), concatenated in
        rank order, on every rank."""
        if not self.ranks.distributed:
            return rows
        size = torch.tensor([rows.shape[0]], dtype=torch.int64, device=self.device)
        sizes = [torch.empty_like(size) for _ in range(self.ranks.world_size)]
        dist.all_gather(sizes, size)
        counts = [int(s.item()) for s in sizes]
        padded = torch.zeros((max(counts), *rows.shape[1:]), dtype=rows.dtype, device=self.device)
        padded[:rows.shape[0]] = rows.to(self.device)
        parts = [torch.empty_like(padded) for _ in range(self.ranks.world_size)]
        dist.all_gather(parts, padded)  # all_gather needs equal shapes: pad to the longest, cut below
        return torch.cat([part[:count].cpu() for part, count in zip(parts, counts)])

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        if not self.ranks.distributed:
            return [value]
        values: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(values, value)
        return values


def peer_failure(err: BaseException, ranks: Ranks, timeout_s: float) -> str | None:
    """One line for ``err`` when it is a failed exchange with the other ranks (under WORLD_SIZE > 1),
    else None: a rank that died, was killed or stopped answering surfaces in the others as a gloo or
    NCCL error from whatever collective they were in."""
    if not ranks.distributed:
        return None
    text = str(err)
    if not (isinstance(err, dist.DistError) or (isinstance(err, RuntimeError)
                                                 and re.search(r"gloo|nccl|NCCL|Connection closed", text))):
        return None
    return (f"lost the other ranks ({_first_sentence(err)}): one of them failed, was killed or did not answer "
            f"within --dist-timeout {timeout_s:g} s; its own error line says why")
