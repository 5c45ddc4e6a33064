"""Offline tools that build, import, inspect and verify datasets; the daemon never imports them."""
