"""Paths the tests find from here, whatever folder a test file sits in: the repository root and ../shared/data."""

from pathlib import Path

# tests/paths.py -> tests/ -> the repository root
REPO_ROOT = Path(__file__).resolve().parent.parent
# the repository's sibling shared/ (the repo is /work/main: /work/shared/data)
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
