"""proto package."""
