"""megabatch loader: the daemon side and the offline dataset tools. Never imports torch."""

from proto import __version__ as __version__  # the one release string, proto's
