"""Wire protocol and shared-memory layout shared by the loader daemon and the trainer (spec: PROTOCOL.md).

Modules: ``messages`` (every wire message), ``codec`` (sans-IO msgpack framing), ``slots`` (the slot
ring's binary layout), ``shm`` (memfd segments and descriptor passing), ``client`` (the trainer's
blocking control client), ``errors`` (the exceptions). This package imports neither ``loader`` nor
``trainer``; it needs only numpy, msgpack and the standard library.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
"""The megabatch release (pyproject.toml's version): here, below both packages, so that the daemon (``loader``
re-exports it) and the trainer (``trainer.provenance``) name the same release without importing each other."""
