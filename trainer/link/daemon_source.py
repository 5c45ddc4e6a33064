"""Link-prediction batches from the loader daemon (``megabatch train --task link --socket PATH``).

The daemon makes the batches (``loader/daemon/link_serving.py``): training batches in PyG's
``LinkNeighborLoader`` layout (``edge_label_index``, ``edge_label``), equal to the in-memory source's for
the same settings, and evaluation batches that embed a split's held-out nodes in order, each carrying its
share of the split's positives and their fixed negative tails (``pair_index``, ``pair_tails``: positions
into those nodes). The negatives per positive and ``disjoint`` are the daemon's (``[link]`` in its config),
as its sampler settings are. This source gives the loop (``trainer.link.loop``) what
``LinkInMemorySource`` gives it; a split's ``held_out`` is known once its evaluation stream has ended.

A batch's tensors are read-only views of its slot, as the node path's are (no copy of the feature rows; a
dataset's float16 rows are widened to float32, a copy): the loop hands the slot back with ``release()`` once
the step, or the embedding, has read them. The evaluation pairs are copied at once. A rank of a job of several
(``ranks``) joins the job on the daemon, which deals it its piece of every global batch and says how many
positives the global batch has (``BatchReady.global_seeds``: the loss scale), as ``LinkInMemorySource(rank,
world_size)`` does, in the shuffled order and in the hierarchical mode's buffer orders alike.
"""

from collections.abc import Callable, Generator, Iterator
from typing import NoReturn

import numpy as np
import torch

from proto.batch_arrays import BatchArrays
from proto.held_pairs import HeldPairs
from proto.messages import BatchReady
from trainer.daemon_source import DaemonError, DaemonSource
from trainer.link.batches import BufferSettings, LinkBatch, NodeBatch
from trainer.ranks import SINGLE, Ranks

__all__ = ["LinkDaemonSource"]


def _node_batch(arrays: BatchArrays, release: Callable[[], None]) -> NodeBatch:
    """Views of the slot, released by ``release`` (float32 rows whatever the dataset stores: the in-memory source
    widens float16 rows the same way)."""
    return NodeBatch(torch.from_numpy(arrays.x.astype(np.float32, copy=False)), torch.from_numpy(arrays.edge_index),
                     [int(v) for v in arrays.nodes_per_hop], [int(v) for v in arrays.edges_per_hop],
                     torch.from_numpy(arrays.n_id), _release=release)


class LinkDaemonSource:
    """A link-prediction session with ``megabatch serve`` at ``socket_path`` (``connect_timeout``, ``on_queued``,
    ``timeout`` and ``ranks`` as ``DaemonSource``'s)."""

    buffer: BufferSettings | None = None
    """The daemon trains the shuffled order (no partition buffer)."""

    def __init__(self, socket_path: str, *, connect_timeout: float = 0.0, timeout: float | None = 60.0,
                 on_queued: Callable[[bool], None] | None = None, ranks: Ranks = SINGLE) -> None:
        self._daemon = DaemonSource(socket_path, timeout=timeout, connect_timeout=connect_timeout,
                                    on_queued=on_queued, pin_slots=False, task="link", ranks=ranks)
        self._distributed = ranks.distributed
        d = self._daemon.dataset
        if len(d.link_positives) != 3 or d.link_negatives < 1:
            self._daemon.close()
            raise DaemonError(f"the loader daemon at {socket_path} describes its link dataset incompletely "
                              f"(positives {d.link_positives}, negatives {d.link_negatives})")
        self.num_features, self.num_hops, self.batch_size = d.num_features, d.num_hops, d.batch_size
        self.negatives, self.disjoint, self.eval_negatives = d.link_negatives, d.link_disjoint, d.link_eval_negatives
        self.train_positives = d.link_positives[0]
        self._positives = {"val": d.link_positives[1], "test": d.link_positives[2]}
        self.held_out: dict[str, HeldPairs] = {}
        """A split's nodes and pairs, once its evaluation stream has ended (``eval_batches``)."""
        welcome = self._daemon.info.description
        self.description = f"{welcome} (link, mode {d.mode}, {d.link_order} order)"
        self.link_order = "shuffled"
        self.served_order = d.link_order
        """The order the daemon's batches follow (``DatasetInfo.link_order``): its hierarchical mode's buffer order
        or "shuffled". The batches arrive in that order already, so the loop treats them as shuffled's
        (``link_order``); the order sets the default learning rate."""

    def positives(self, split: str) -> int:
        """Held-out positives of ``split`` ("val" or "test")."""
        return self._positives[split]

    def buffer_epoch(self, epoch: int) -> NoReturn:
        raise ValueError("the daemon's link batches have no buffer order")

    def _link_batch(self, ready: BatchReady) -> LinkBatch:
        arrays, release = self._daemon.read_slot(ready)
        if arrays.edge_label_index is None or arrays.edge_label is None:
            release()
            raise DaemonError(f"train batch seq {ready.seq} carries no edge_label_index (not a link batch)")
        positives = int(np.count_nonzero(arrays.edge_label))
        weight = None if arrays.edge_weight is None else torch.from_numpy(arrays.edge_weight)
        return LinkBatch(_node_batch(arrays, release), torch.from_numpy(arrays.edge_label_index),
                         torch.from_numpy(arrays.edge_label), positives,
                         global_positives=ready.global_seeds if self._distributed else None,
                         stream_batches=ready.num_batches if ready.num_batches >= 0 else None, edge_weight=weight)

    def train_batches(self, epoch: int) -> Generator[LinkBatch, None, None]:
        """Epoch ``epoch``'s training batches (the daemon fixes them: the same epoch gives the same batches)."""
        yield from self._daemon.train_stream(epoch, self._link_batch)

    def eval_batches(self, split: str) -> Iterator[NodeBatch]:
        """Node batches over the split's held-out nodes, in order; once the stream ends, ``held_out[split]`` holds
        those nodes (the batches' seeds, concatenated) and the pairs the batches carried."""
        seeds: list[np.ndarray] = []
        pairs: list[np.ndarray] = []
        tails: list[np.ndarray] = []

        def node_batch(ready: BatchReady) -> NodeBatch:
            arrays, release = self._daemon.read_slot(ready)
            if arrays.pair_index is None or arrays.pair_tails is None:
                release()
                raise DaemonError(f"{split} batch seq {ready.seq} carries no pair_index (not a link batch)")
            seeds.append(np.array(arrays.n_id[:int(arrays.nodes_per_hop[0])]))
            pairs.append(np.array(arrays.pair_index))
            tails.append(np.array(arrays.pair_tails))
            return _node_batch(arrays, release)

        self.held_out.pop(split, None)  # a stream cut short leaves no half-known split behind
        yield from self._daemon.eval_stream(split, node_batch)
        nodes = np.concatenate(seeds) if seeds else np.zeros(0, dtype=np.int64)
        index = np.concatenate(pairs, axis=1) if pairs else np.zeros((2, 0), dtype=np.int64)
        negatives = np.concatenate(tails) if tails else np.zeros((0, self.eval_negatives), dtype=np.int64)
        if index.shape[1] != self._positives[split] or (index.size and index.max() >= len(nodes)) or \
                (negatives.size and negatives.max() >= len(nodes)):
            raise DaemonError(f"{split} evaluation: {index.shape[1]} pairs over {len(nodes)} nodes, the daemon "
                              f"announced {self._positives[split]} positives")
        self.held_out[split] = HeldPairs(nodes, index[0], index[1], negatives)

    def close(self) -> None:
        self._daemon.close()
