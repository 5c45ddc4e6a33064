"""The metrics endpoint: a port that cannot be bound is a configuration error naming the address and key."""

import socket

import pytest

from loader.daemon.metrics import DaemonMetrics
from proto.errors import UserError


def test_a_port_in_use_names_the_address_port_and_key():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError) as info:
            DaemonMetrics().serve("127.0.0.1", port)
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "[metrics] port" in message and "Address already in use" in message
    assert "\n" not in message


def test_port_0_serves_nothing():
    DaemonMetrics().serve("127.0.0.1", 0)  # no socket to bind: nothing raised
