"""Neighbour sampling: the in-memory sampler and the exact out-of-core one with its list reader and cache."""
