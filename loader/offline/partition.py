"""Node partitioners for ``prepare``: METIS (min edge-cut, in memory), Fennel streaming, random.

Each returns ``part`` (int32, one partition id per original node id). METIS and the
streaming partitioner read a symmetric, self-loop-free, deduplicated CSR that ``prepare``
builds out of core (``SymmetricAdjacency``).
"""

import abc
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pymetis

from loader.format.npyio import NpyReader, read_npy, rows_per_chunk
from loader.offline.partition_kernels import fennel_assign
from proto.errors import UserError
from proto.progress import Progress
from proto.sizes import format_size

__all__ = ["SymmetricAdjacency", "Partitioner", "MetisPartitioner", "StreamPartitioner",
           "RandomPartitioner", "PARTITIONERS", "make_partitioner"]


@dataclass(frozen=True)
class SymmetricAdjacency:
    """A symmetric CSR on disk: ``indptr`` int64 (N+1,), ``indices`` int64 (nnz,), sorted rows."""

    indptr: Path
    indices: Path
    num_nodes: int


class Partitioner(abc.ABC):
    """Assigns every node to one of ``num_parts`` partitions."""

    name: ClassVar[str]
    needs_adjacency: ClassVar[bool] = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def check_memory(self, num_nodes: int, num_edges: int, budget: int) -> None:  # noqa: B027 (optional hook)
        """Raise UserError when this partitioner cannot run within ``budget`` bytes (default: never)."""

    @abc.abstractmethod
    def partition(self, num_nodes: int, num_parts: int, adjacency: SymmetricAdjacency | None,
                  budget: int, progress: bool) -> np.ndarray:
        """Return int32 partition ids for nodes ``0..num_nodes-1``."""

    def params(self) -> dict[str, float | int | str]:
        """Parameters recorded in the manifest."""
        return {"seed": self.seed}


class MetisPartitioner(Partitioner):
    """pymetis k-way partitioning (minimum edge-cut); the whole symmetric CSR must fit in memory."""

    name = "metis"
    # METIS keeps the input graph, a copy in idx_t and a coarsening hierarchy (~geometric,
    # about twice the input); measured peak on coauthor-physics is ~4x the CSR bytes.
    MEMORY_FACTOR = 5

    def estimate_bytes(self, num_nodes: int, num_edges: int) -> int:
        return self.MEMORY_FACTOR * 8 * ((num_nodes + 1) + 2 * num_edges)

    def check_memory(self, num_nodes: int, num_edges: int, budget: int) -> None:
        need = self.estimate_bytes(num_nodes, num_edges)
        if need > budget:
            raise UserError(f"METIS needs about {format_size(need)} for {num_nodes} nodes and {num_edges} "
                            f"edges, more than the {format_size(budget)} left of --memory-budget; "
                            f"use --partitioner stream (or raise --memory-budget)")

    def partition(self, num_nodes: int, num_parts: int, adjacency: SymmetricAdjacency | None,
                  budget: int, progress: bool) -> np.ndarray:
        assert adjacency is not None
        if num_parts == 1:
            return np.zeros(num_nodes, dtype=np.int32)
        xadj = read_npy(adjacency.indptr)
        adjncy = read_npy(adjacency.indices)
        with Progress("partition (metis)", 1, "graphs", enabled=progress) as bar:
            result = pymetis.part_graph(num_parts, adjacency=pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
                                        options=pymetis.Options(seed=self.seed))
            bar.update()
        return np.asarray(result.vertex_part, dtype=np.int32)


class StreamPartitioner(Partitioner):
    """Fennel (Tsourakakis et al., WSDM 2014): one pass over nodes in id order, O(N + P) memory.

    The neighbour lists stream from disk in budgeted chunks, so only the assignment and the
    partition sizes stay in memory. ``slack`` bounds imbalance: no partition exceeds
    ``(1 + slack) * N / P`` nodes. ``gamma`` is Fennel's balance exponent (1.5 in the paper).
    ``passes`` > 1 restreams: later passes re-place each node knowing every neighbour's partition.
    """

    name = "stream"

    def __init__(self, seed: int = 0, slack: float = 0.05, gamma: float = 1.5, passes: int = 2) -> None:
        super().__init__(seed)
        self.slack = slack
        self.gamma = gamma
        self.passes = passes

    def params(self) -> dict[str, float | int | str]:
        return {"seed": self.seed, "algorithm": "fennel", "slack": self.slack, "gamma": self.gamma,
                "order": "node id", "passes": self.passes}

    def partition(self, num_nodes: int, num_parts: int, adjacency: SymmetricAdjacency | None,
                  budget: int, progress: bool) -> np.ndarray:
        assert adjacency is not None
        assignment = np.full(num_nodes, -1, dtype=np.int32)
        sizes = np.zeros(num_parts, dtype=np.int64)
        counts = np.zeros(num_parts, dtype=np.int64)
        capacity = int(math.ceil((1.0 + self.slack) * num_nodes / num_parts)) + 1
        with NpyReader(adjacency.indptr) as ptr_reader, NpyReader(adjacency.indices) as idx_reader:
            nnz = idx_reader.nrows
            undirected_edges = max(1, nnz // 2)
            # Fennel's alpha balances edge gains against partition-size penalties.
            alpha = math.sqrt(num_parts) * undirected_edges / max(1.0, num_nodes ** self.gamma)
            avg_row_bytes = 8 * (1 + nnz / max(1, num_nodes))
            rows = rows_per_chunk(int(avg_row_bytes) + 1, budget // 2, minimum=1024)
            with Progress("partition (stream)", num_nodes * self.passes, "nodes", enabled=progress) as bar:
                for start in ((s) for _ in range(self.passes) for s in range(0, num_nodes, rows)):
                    stop = min(num_nodes, start + rows)
                    indptr = ptr_reader.read(start, stop + 1)
                    indices = idx_reader.read(int(indptr[0]), int(indptr[-1]))
                    fennel_assign(indptr, indices, start, assignment, sizes, alpha, self.gamma,
                                  capacity, counts)
                    bar.update(stop - start)
        return assignment


class RandomPartitioner(Partitioner):
    """Seeded random balanced assignment (MariusGNN's default); needs no adjacency."""

    name = "random"
    needs_adjacency = False

    def partition(self, num_nodes: int, num_parts: int, adjacency: SymmetricAdjacency | None,
                  budget: int, progress: bool) -> np.ndarray:
        order = np.random.default_rng(self.seed).permutation(num_nodes)
        part = np.empty(num_nodes, dtype=np.int32)
        part[order] = (np.arange(num_nodes, dtype=np.int64) * num_parts // num_nodes).astype(np.int32)
        return part


PARTITIONERS: dict[str, type[Partitioner]] = {
    cls.name: cls for cls in (MetisPartitioner, StreamPartitioner, RandomPartitioner)
}


def make_partitioner(name: str, seed: int = 0) -> Partitioner:
    """The partitioner called ``name`` (``metis``, ``stream`` or ``random``)."""
    try:
        return PARTITIONERS[name](seed=seed)
    except KeyError:
        raise UserError(f"--partitioner: unknown {name!r}; choose one of {', '.join(PARTITIONERS)}") from None
