"""megabatch loader: the daemon side and the offline dataset tools. Never imports torch."""

__version__ = "0.1.0"
