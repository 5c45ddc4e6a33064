"""Belady-planned feature-row caches and the scattered row reads that fill them."""
