"""The on-disk dataset formats (raw and prepared) and their low-level reads, writes and checks."""
