"""The daemon's HTTP port (``[metrics] address`` and ``port``): Prometheus metrics and two health probes.

``/metrics``  the registry in the exposition format the scraper asks for (gzip where accepted), as
              prometheus-client's own server gives it;
``/healthz``  200 while the process's event loop answers (``Probes.alive``), else 503: a hung loop is a
              daemon that serves nobody even though its process and this thread live on;
``/readyz``   200 while the daemon serves (dataset open, socket listening), 503 before and while it drains;
anything else 404. A probe's body is one line saying why, for a human with curl.

The server is ``http.server``'s threaded one on a daemon thread: a slow scrape never waits for the
event loop, and the loop never waits for a scrape. Nothing here imports the daemon, which hands in
its probes.
"""

import gzip
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from proto.errors import UserError

__all__ = ["Probes", "NO_PROBES", "HttpEndpoint", "serve_http"]

log = logging.getLogger("megabatch.http")


@dataclass(frozen=True)
class Probes:
    """What the health paths ask, each answering (ok, one line why); called on the server's threads."""

    alive: Callable[[], tuple[bool, str]]
    ready: Callable[[], tuple[bool, str]]


def _unknown() -> tuple[bool, str]:
    return False, "no daemon reports its health on this endpoint"


NO_PROBES = Probes(_unknown, _unknown)
"""For an endpoint that serves metrics alone: both probes answer 503."""


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def do_GET(self) -> None:  # http.server dispatches on this name
        path = urlsplit(self.path).path
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            body = encoder(self.server.registry)
            headers = [("Content-Type", content_type)]
            if gzip_accepted(self.headers.get("Accept-Encoding", "")):
                body = gzip.compress(body)
                headers.append(("Content-Encoding", "gzip"))
            self._reply(200, body, headers)
        elif path in ("/healthz", "/readyz"):
            probe = self.server.probes.alive if path == "/healthz" else self.server.probes.ready
            ok, why = probe()
            self._reply(200 if ok else 503, f"{why}\n".encode(), [("Content-Type", "text/plain; charset=utf-8")])
        else:
            self._reply(404, b"not found: /metrics, /healthz and /readyz are served here\n",
                        [("Content-Type", "text/plain; charset=utf-8")])

    def _reply(self, code: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # http.server writes every request to stderr: a scrape every 15 s would flood the journal
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    """A scrape in flight never holds the process's exit."""

    def __init__(self, address: tuple[str, int], family: int, registry: CollectorRegistry, probes: Probes) -> None:
        self.address_family = family
        self.registry = registry
        self.probes = probes
        super().__init__(address, _Handler)


class HttpEndpoint:
    """A running endpoint: its bound port, and ``close`` (stops serving, frees the port)."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="megabatch-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve_http(registry: CollectorRegistry, address: str, port: int, probes: Probes) -> HttpEndpoint:
    """Serve ``registry`` and ``probes`` on ``address``:``port`` (0: a port the kernel picks).

    A port that cannot be bound (another daemon's, a privileged one, an address not on this host) is a
    ``UserError`` naming the address, port and key: a configuration error (exit 78), since a restart
    would meet the same port."""
    try:
        # the family follows the address, so "::1" binds IPv6 (HTTPServer alone assumes IPv4)
        family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        server = _Server((str(sockaddr[0]), port), family, registry, probes)
    except OSError as err:
        why = err.strerror or str(err)
        raise UserError(f"[metrics] port: cannot serve metrics on {address}:{port}: {why} (another daemon "
                        f"on this port? set [metrics] port to a free one, or 0 for no metrics)") from None
    endpoint = HttpEndpoint(server)
    log.debug("metrics and health probes on http://%s:%d/ (/metrics, /healthz, /readyz)", address, endpoint.port)
    return endpoint
