"""Where this process stands among the training processes (ranks), from the environment torchrun sets.

torchrun, and ``megabatch train --nproc-per-node`` (``trainer.launch``) the same way, give every rank
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Without WORLD_SIZE, or with WORLD_SIZE=1,
the process trains alone. No torch here: the command line reads this before it imports torch.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass

from proto.errors import UserError

__all__ = ["DEFAULT_TIMEOUT_S", "Ranks", "SINGLE", "ranks_from_env"]

DEFAULT_TIMEOUT_S = 300.0
"""Longest a rank waits for the others at a collective (``--dist-timeout``). It must cover the longest
time one rank works alone while the others wait: the slowest rank's start (loading the dataset), rank
0 writing a checkpoint, the ranks' unequal shares of an evaluation."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training processes: ``rank`` of ``world_size`` (default 0 of 1),
    ``local_rank`` on its machine (default 0; it picks the GPU)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    """Ranks on this machine (torchrun's LOCAL_WORLD_SIZE): how many connect to this machine's daemon."""
    job: str = ""
    """The job's name for the loader daemon: torchrun's run id, else MASTER_ADDR:MASTER_PORT (unique
    among the jobs that run at once, and the same on every rank)."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise UserError(f"WORLD_SIZE must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise UserError(f"RANK must be in [0, {self.world_size}) for WORLD_SIZE {self.world_size}, got {self.rank}")
        if self.local_rank < 0:
            raise UserError(f"LOCAL_RANK must not be negative, got {self.local_rank}")
        if not 1 <= self.local_world_size <= self.world_size:
            raise UserError(f"LOCAL_WORLD_SIZE must be in [1, {self.world_size}] for WORLD_SIZE {self.world_size}, "
                            f"got {self.local_world_size}")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that logs, writes ``--json-out`` and checkpoints."""
        return self.rank == 0

    def label(self) -> str:
        """"rank 1/4", for error lines."""
        return f"rank {self.rank}/{self.world_size}"


SINGLE = Ranks()
"""A process training alone."""


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise UserError(f"environment variable {name}={text!r} is not an integer") from None


def ranks_from_env(env: Mapping[str, str] | None = None) -> Ranks:
    """The ``Ranks`` torchrun's variables describe (default ``os.environ``); ``SINGLE`` without WORLD_SIZE.

    With WORLD_SIZE > 1, RANK, MASTER_ADDR and MASTER_PORT must be set (LOCAL_RANK defaults to 0,
    LOCAL_WORLD_SIZE to WORLD_SIZE: every rank on this machine).
    """
    env = os.environ if env is None else env
    world_size = _env_int(env, "WORLD_SIZE", 1)
    if world_size < 1:
        raise UserError(f"environment variable WORLD_SIZE={world_size} must be at least 1")
    if world_size == 1:
        return SINGLE
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise UserError(f"WORLD_SIZE is {world_size} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                        "not set (start the ranks with torchrun, or use --nproc-per-node)")
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    job = run_id if run_id and run_id != "none" else f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return Ranks(rank=_env_int(env, "RANK", 0), world_size=world_size, local_rank=_env_int(env, "LOCAL_RANK", 0),
                 local_world_size=_env_int(env, "LOCAL_WORLD_SIZE", world_size), job=job)
