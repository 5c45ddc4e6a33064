"""The generator's promise, checked with real models: a 2-layer GraphSAGE beats a 2-layer MLP.

Full-batch training on a small generated graph, fixed seeds, so the outcome is deterministic.
(Lives with the trainer-side dependencies: torch and torch-geometric, the `trainer` extra.)
"""

import numpy as np
import torch
from torch_geometric.nn import SAGEConv

from loader.format.npyio import read_npy
from loader.format.raw import iter_edge_chunks
from loader.offline.generate import generate_graph


class Sage(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(dim, hidden)
        self.conv2 = SAGEConv(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x, edge_index)), edge_index)


class Mlp(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_graphsage_beats_mlp_on_generated_graph(tmp_path):
    raw = generate_graph(tmp_path / "raw", num_nodes=4000, avg_degree=10, feat_dim=32, num_classes=5, seed=1,
                         progress=False)
    src, dst = next(iter_edge_chunks(raw, 1 << 30))
    x = torch.from_numpy(read_npy(raw.features))
    y = torch.from_numpy(read_npy(raw.labels))
    edge_index = torch.from_numpy(np.stack([src, dst]))
    train, test = (torch.from_numpy(read_npy(raw.split(name))) for name in ("train", "test"))
    accuracy = {}
    for name, cls in (("sage", Sage), ("mlp", Mlp)):
        torch.manual_seed(0)
        model = cls(32, 64, 5)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(60):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x, edge_index)[train], y[train])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy[name] = (model(x, edge_index)[test].argmax(1) == y[test]).float().mean().item()
    print(f"test accuracy: {accuracy}")
    assert accuracy["sage"] >= accuracy["mlp"] + 0.10, accuracy
