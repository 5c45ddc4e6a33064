"""``python -m trainer``: the implementation of ``megabatch train``."""

import sys

from trainer.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
