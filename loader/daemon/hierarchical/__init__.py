"""The hierarchical mode: mega-batch schedule, partition reads, assembly, memory plan and pipeline."""
