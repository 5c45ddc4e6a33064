"""The loader daemon: server, client sessions, publishing into slots, config, metrics."""
