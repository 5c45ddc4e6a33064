"""The link-prediction model: a node encoder (the node task's ``SampledGNN``, without a class head) and
an edge decoder.

The encoder is the node task's GraphSAGE, GCN or GAT stack with its last layer ``hidden`` wide: its
output is the seeds' ``hidden``-dim embeddings. The decoder turns a pair's two embeddings into one logit:

- ``dot``: ``<h_u, h_v>``, no parameters (PyG's ``link_pred`` example);
- ``mlp``: ``Linear(hidden, hidden) -> ReLU -> Linear(hidden, 1)`` on the Hadamard product ``h_u * h_v``.

Both are symmetric in u and v, which an undirected dataset needs: its pairs are stored in one direction
only, an arbitrary one.
"""

import torch
from torch import Tensor

from trainer.link.options import DECODERS
from trainer.models import SampledGNN

__all__ = ["DECODERS", "LinkModel"]


class LinkModel(torch.nn.Module):
    """``encoder`` (a ``SampledGNN`` of kind ``kind``, out_dim = ``hidden``) and a ``decoder`` ("dot" or "mlp")."""

    def __init__(self, kind: str, in_dim: int, hidden: int, num_layers: int, dropout: float, heads: int = 4,
                 decoder: str = "dot") -> None:
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
        self.encoder = SampledGNN(kind, in_dim, hidden, hidden, num_layers, dropout, heads)
        self.decoder = decoder
        self.mlp = None
        if decoder == "mlp":
            self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                           torch.nn.Linear(hidden, 1))

    def embed(self, x: Tensor, edge_index: Tensor, num_sampled_nodes: list[int],
              num_sampled_edges: list[int]) -> Tensor:
        """Embeddings of the ``num_sampled_nodes[0]`` seeds (the first rows of ``x``)."""
        return self.encoder(x, edge_index, num_sampled_nodes, num_sampled_edges)

    def decode(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        """One logit per pair: (n, hidden) x (n, hidden) -> (n,)."""
        if self.mlp is None:
            return (h_src * h_dst).sum(dim=-1)
        return self.mlp(h_src * h_dst).squeeze(-1)

    def forward(self, x: Tensor, edge_index: Tensor, num_sampled_nodes: list[int], num_sampled_edges: list[int],
                edge_label_index: Tensor) -> Tensor:
        """Logits of the pairs ``edge_label_index`` (positions among the seeds) of one sampled batch."""
        h = self.embed(x, edge_index, num_sampled_nodes, num_sampled_edges)
        # index_select, not h[index]: the backward of advanced indexing on CPU (index_put_ with accumulate) adds
        # the gradient rows with parallel atomic float adds, in a different order each run; index_select's
        # (index_add_) adds them in index order, so a run is reproducible bit for bit
        return self.decode(h.index_select(0, edge_label_index[0]), h.index_select(0, edge_label_index[1]))
