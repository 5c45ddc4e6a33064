"""The full-graph modes (exact, static, mmap, inmemory): superbatches sampled over the whole graph."""
