"""Staged windows: a window of exact-schedule batches' feature rows, gathered by one sequential pass over
``features.bin`` into per-batch regions of a staging file (``window_plan`` lays them out, ``stager``
fills and reads them back)."""
