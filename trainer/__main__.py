"""``python -m trainer``: the implementation of ``megabatch train``."""

from trainer.cli import exit_program, main

__all__: list[str] = []

if __name__ == "__main__":
    exit_program(main())
