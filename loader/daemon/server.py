"""``megabatch serve``: the daemon's lifecycle, in the uvicorn shape.

run -> serve -> startup -> main_loop -> shutdown. Signals: the first SIGINT/SIGTERM drains (stop
accepting; end every stream and send every session ``Shutdown``; wait up to ``[server] drain_timeout``
for the clients to release the batches already published and for the pipeline's stages to stop;
then close the connections, cancel what is left, unmap the slots, remove the socket); a second one
cuts the wait. Who is connected lives in ``DaemonState``, who holds the training pipeline in
``PipelineOwnership`` (``loader.daemon.ownership``), the read-only resources in ``ServingContext``.

A connection is admitted in steps, each cheaper than the next: the peer's credentials against
``[server] allow_uids`` / ``allow_gids`` (right after accept), the ``max_pending`` cap on connections
still owing their Hello, the Hello itself, then ``max_clients``; only then is a session's memory made.
"""

import asyncio
import collections
import contextlib
import gc
import logging
import os
import signal
import socket
import stat
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from loader import __version__
from loader.daemon.config import LoaderConfig
from loader.daemon.eval_stream import EvalAccess
from loader.daemon.health import Health, StatusLine, report_to_systemd, start_failure
from loader.daemon.http_endpoint import HttpEndpoint, Probes
from loader.daemon.jobs import Job, JobRank, job_mismatch
from loader.daemon.link_serving import task_refusal
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.mode import TrainingMode
from loader.daemon.mode_setup import prepare_setup
from loader.daemon.modes import open_mode
from loader.daemon.ownership import PipelineOwnership
from loader.daemon.peers import PeerCredentials, Throttle, peer_credentials, peer_description
from loader.daemon.read_metrics import CLIENT_NAME_CHARS, client_info
from loader.daemon.serving import ServingContext
from loader.daemon.session import ControlProtocol, Session, loggable
from loader.daemon.slot_sizing import SessionSizing
from loader.daemon.stages import TrainPipeline
from loader.daemon.trainer_cache import TrainerCache, accepted_rows
from loader.daemon.welcome import dataset_info, dealing_fingerprint
from loader.sampling.ranks import LocalRanks
from proto.codec import FrameDecoder, encode
from proto.errors import ProtocolError, ShmError, UserError
from proto.messages import PROTOCOL_VERSION, DatasetInfo, Error, ErrorCode, Hello, SlotLayout, Welcome
from proto.shm import create_segment
from proto.sizes import counted, format_size
from proto.slots import HEADER_BYTES, SlotRing

__all__ = ["Daemon", "DaemonState", "HANDSHAKE_TIMEOUT", "ACCEPT_BACKOFF"]

log = logging.getLogger("megabatch.server")

HANDSHAKE_TIMEOUT = 10.0
"""Seconds a new connection has to send its Hello."""

SOCKET_PATH_MAX = 107

ACCEPT_BACKOFF = 0.5
"""Seconds the daemon stops accepting after a failed accept (EMFILE, ENFILE: out of descriptors)."""


def _in_job(hello: Hello) -> bool:
    """Whether the Hello comes from one rank of a job of several (a job of one rank is a lone trainer)."""
    return bool(hello.job) and hello.world_size > 1


@dataclass
class DaemonState:
    """Mutable runtime state: who is connected."""

    sessions: dict[int, Session] = field(default_factory=dict)
    next_session: int = 1
    jobs: dict[str, Job] = field(default_factory=dict)
    """Training jobs of several ranks with at least one rank connected, by ``Hello.job``."""
    tasks: set["asyncio.Task[None]"] = field(default_factory=set)
    disposing: set["asyncio.Task[None]"] = field(default_factory=set)
    """Disconnected sessions whose slots are not unmapped yet (they still count against max_clients)."""
    pending: set[socket.socket] = field(default_factory=set)
    """Accepted connections whose Hello has not arrived yet (capped by ``[server] max_pending``)."""
    refusing: set[socket.socket] = field(default_factory=set)
    """Refused connections kept open until their client has read why (capped by ``max_pending`` too)."""


class Daemon:
    """One loader daemon serving one prepared dataset."""

    def __init__(self, config: LoaderConfig) -> None:
        self.config = config
        self.state = DaemonState()
        self.metrics = DaemonMetrics()
        self.ownership = PipelineOwnership(self._start_pipeline, config.server.idle_timeout, self.metrics)
        """Who holds the training pipeline, and the line of trainers waiting for it."""
        self.should_exit = asyncio.Event()
        self.force_exit = False
        self._forced = asyncio.Event()
        """Set with ``force_exit`` by a second signal: it cuts the drain short."""
        self.exit_reason = "the daemon is stopping"
        """What ``Shutdown`` tells the clients (``handle_exit`` names the signal)."""
        self._accepting: asyncio.Task[None] | None = None
        self._listener: socket.socket | None = None
        self._serving: ServingContext | None = None
        self.mode: TrainingMode | None = None
        """The ``[loader] mode``, opened at startup: it owns the memory plan, the stages and evaluation access."""
        self._welcome_info: DatasetInfo | None = None
        self._dealing = ""
        """``Welcome.dealing``: set at startup (``dealing_fingerprint``)."""
        self.sessions = SessionSizing(0, 0, 0)
        """Clients served at once and their slots, resolved at startup (nobody connects before)."""
        self.ready = asyncio.Event()
        """Set once the socket accepts connections (tests and embedders wait on it)."""
        self.allow_uids: frozenset[int] = frozenset()
        self.allow_gids: frozenset[int] = frozenset()
        """Peers admitted, resolved at startup from ``[server] allow_uids`` / ``allow_gids`` and their defaults."""
        self._throttles: collections.defaultdict[str, Throttle] = collections.defaultdict(Throttle)
        self.health = Health()
        """The phase /healthz, /readyz and systemd's STATUS= report (``health.py``)."""
        self._http: HttpEndpoint | None = None
        self._status: StatusLine | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def run(self) -> None:
        uvloop.run(self.serve())

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        # signals reach only the main thread; an embedded daemon (tests) stops through should_exit
        signals = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.handle_exit, sig)
        self.health.starting(loop)
        try:
            try:
                await self.startup()
            except BaseException as err:
                self.health.failed(start_failure(err))  # systemd's STATUS= says why, not "draining"
                raise
            await self.main_loop()
        finally:
            await self.shutdown()
            for sig in signals:
                loop.remove_signal_handler(sig)

    def handle_exit(self, sig: int) -> None:
        """Signal handler (on the loop): the first signal drains, a second one cuts the drain."""
        name = signal.Signals(sig).name
        if self.should_exit.is_set():
            log.warning("second %s: shutting down without waiting", name)
            self.force_exit = True
            self._forced.set()
        else:
            log.info("%s: draining for up to %g s ([server] drain_timeout; send it again to stop at once)", name,
                     self.config.server.drain_timeout)
            self.exit_reason = f"{name} received"
        self.should_exit.set()

    async def startup(self) -> None:
        cfg = self.config
        # first: a port clash fails at once, and /readyz answers 503 while the dataset loads
        self._http = self.metrics.serve(cfg.metrics.address, cfg.metrics.port,
                                        Probes(self.health.alive, self.health.ready))
        cpu_pool = ThreadPoolExecutor(2, thread_name_prefix="megabatch-cpu")
        setup = prepare_setup(cfg, self.metrics, cpu_pool)
        dataset, resident, m = setup.dataset, setup.resident, setup.dataset.manifest
        self._serving, self.sessions = setup.serving, setup.sessions
        self.mode = open_mode(setup)
        log.info("%s", self.mode.budget_plan.describe())
        estimate = setup.serving.aggregation_estimate
        if estimate is not None:
            log.info("%s", estimate.describe(cfg.sampler.aggregation_cache, cfg.loader.mode))
            self.metrics.set_aggregation(cfg.sampler.aggregation_cache, (estimate.rows_without, estimate.rows_with),
                                         (estimate.bytes_without, estimate.bytes_with))
        self._welcome_info = dataset_info(dataset, resident, cfg, setup.serving.link, self.mode.link_order())
        self._dealing = dealing_fingerprint(dataset, cfg, self.mode.summary())
        # a link dataset's buffer states measure no neighbour coverage or label skew
        self.metrics.set_build(dataset.path.name, cfg.loader.mode,
                               measures_quality=self.mode.measures_quality and setup.serving.link is None)
        self.metrics.memory_budget.set(cfg.memory.budget)
        self.metrics.watch_slots(self._slot_usage)
        self.metrics.watch_clients(self.state.sessions)
        self.metrics.memory_plan.set(self.mode.budget_plan.total)
        self._listener = self._listen(cfg.server.socket, cfg.server.socket_mode)
        # the defaults admit whom the socket's mode admits (owner and group), root excepted
        self.allow_uids = frozenset(cfg.server.allow_uids or (os.geteuid(),))
        self.allow_gids = frozenset(cfg.server.allow_gids or (os.stat(cfg.server.socket).st_gid,))
        log.info("admitting peers of uid %s or group %s ([server] allow_uids, allow_gids)",
                 ", ".join(map(str, sorted(self.allow_uids))), ", ".join(map(str, sorted(self.allow_gids))))
        self._accepting = self._spawn(self._accept_loop(), "accept")
        log.info("serving %s (%s nodes, %s) on %s", dataset.path, f"{m.num_nodes:,}", self.mode.summary(),
                 cfg.server.socket)
        self._status = StatusLine(dataset.path.name, self.metrics.registry, lambda: len(self.state.sessions))
        self.health.serving(self._status())  # READY=1
        self.ready.set()

    async def main_loop(self) -> None:
        assert self._status is not None
        await report_to_systemd(self.should_exit, self._status)  # WATCHDOG=1 and STATUS= from this loop

    async def shutdown(self) -> None:
        """Drain, then stop, in this order (docs/DEPLOY.md, "Stopping"):

        1. stop accepting (refuse handshakes still on their way with ``busy``);
        2. every session ends its stream (no new batch) and is sent ``Shutdown(exit_reason)``;
        3. wait up to ``[server] drain_timeout`` (a second signal cuts it) until every client has
           released the batches it was sent, or left, and the pipeline's stages have stopped;
        4. close the connections, cancel what is left and wait for it (a job already in a thread
           cannot be interrupted: it lands first), shut the pools down, unmap the slots;
        5. remove the socket file.
        """
        self.health.draining()  # STOPPING=1; /readyz 503
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._accepting is not None:
            self._accepting.cancel()
        sessions = list(self.state.sessions.values())
        for session in sessions:
            session.begin_shutdown(self.exit_reason)
        await self._drain(sessions)
        for session in list(self.state.sessions.values()):
            session.close()
        # closed streams have handed their pipeline to a stop task: it must end before the pools
        await self.ownership.stop()
        for task in list(self.state.tasks - self.state.disposing):
            task.cancel()
        pending = [s.dispose() for s in self.state.sessions.values()] + list(self.state.tasks)
        self.state.sessions.clear()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._serving is not None:
            self._serving.cpu_pool.shutdown(wait=True, cancel_futures=True)
            self._serving.close()
        if self.mode is not None:
            self.mode.close()
            self.mode = None
        with contextlib.suppress(FileNotFoundError):
            if self.ready.is_set():
                os.unlink(self.config.server.socket)
        if self.ready.is_set():
            # a daemon that never served says nothing here: its error line (printed by the CLI after this
            # shutdown) is all the user should read, and read last
            log.info("stopped")
        if self._http is not None:
            self._http.close()
            self._http = None

    async def _drain(self, sessions: list[Session]) -> None:
        """Step 3 of ``shutdown``: wait for ``sessions`` to drain and the pipeline to stop, at most
        ``[server] drain_timeout`` seconds, less if a second signal comes (``force_exit``)."""
        if not sessions and self.ownership.quiet:
            return

        async def drained() -> None:
            await asyncio.gather(*(s.drained.wait() for s in sessions))
            await self.ownership.stop()  # every stream is over: nothing reads the pipeline's data any more

        timeout = self.config.server.drain_timeout
        drain = asyncio.ensure_future(drained())
        forced = asyncio.ensure_future(self._forced.wait())
        try:
            await asyncio.wait({drain, forced}, timeout=0.0 if self.force_exit else timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
            if not drain.done():
                held = sum(s.flow.in_use for s in sessions if not s.closed)
                why = "a second signal" if self.force_exit else f"[server] drain_timeout = {timeout:g} s"
                log.warning("drain cut short by %s: %d published batches not released, %d sessions still "
                            "connected", why, held, sum(not s.closed for s in sessions))
                drain.cancel()
            await asyncio.gather(drain, forced, return_exceptions=True)
        if drain.done() and not drain.cancelled():
            log.info("drained: every published batch released, the pipeline stopped")

    # -- connections ---------------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> "asyncio.Task[None]":
        task = asyncio.ensure_future(coro)
        task.set_name(f"megabatch-{name}")
        self.state.tasks.add(task)
        task.add_done_callback(self.state.tasks.discard)
        return task

    def _listen(self, path: Path, mode: int) -> socket.socket:
        if len(os.fsencode(path)) > SOCKET_PATH_MAX:
            raise UserError(f"[server] socket: path {path} is longer than {SOCKET_PATH_MAX} bytes "
                            f"(a Unix socket limit)")
        if not path.parent.is_dir():
            raise UserError(f"[server] socket: directory {path.parent} does not exist")
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise UserError(f"[server] socket: {path} exists and is not a socket; refusing to replace it")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(str(path))
                except OSError:
                    path.unlink()  # stale: left by a daemon that died
                else:
                    raise UserError(f"[server] socket: another daemon is serving on {path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            old = os.umask(0o777 & ~mode)
            try:
                sock.bind(str(path))
            finally:
                os.umask(old)
            os.chmod(path, mode)
            sock.listen(64)
            sock.setblocking(False)
        except OSError as err:
            sock.close()
            raise UserError(f"[server] socket: cannot listen on {path} ({err.strerror})") from None
        return sock

    async def _accept(self) -> socket.socket:
        """The next connection (a method of its own so that tests can inject accept failures)."""
        assert self._listener is not None
        conn, _ = await asyncio.get_running_loop().sock_accept(self._listener)
        return conn

    async def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self.should_exit.is_set():
            try:
                conn = await self._accept()
            except OSError as err:
                if self._listener is None:
                    return
                # out of descriptors (EMFILE, ENFILE) the connection stays queued and the listener readable,
                # so retrying at once fails at once, forever: pause until sessions have closed some
                self.metrics.accept_errors.inc()
                self._throttles["accept"].warn("accept failed: %s; not accepting for %g s", err, ACCEPT_BACKOFF)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.should_exit.wait(), ACCEPT_BACKOFF)
                continue
            conn.setblocking(False)
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        """Start the handshake of ``conn``, or close it at once: a peer outside the allow lists, or one
        connection too many waiting for its Hello, costs no task, no buffer and no shared memory."""
        peer = peer_credentials(conn)
        if peer is None or not self.admits(peer):
            who = peer.describe() if peer is not None else "a peer without credentials"
            self._refuse_now(conn, "forbidden", ErrorCode.FORBIDDEN,
                             f"{who} may not use this daemon (not in [server] allow_uids or allow_gids)")
            return
        limit = self.config.server.max_pending
        if len(self.state.pending) >= limit:
            self._refuse_now(conn, "pending", ErrorCode.BUSY,
                             f"{limit} connections are waiting for their hello ([server] max_pending)")
            return
        self.state.pending.add(conn)
        self._spawn(self._handshake(conn), "handshake")

    def admits(self, peer: PeerCredentials) -> bool:
        """Whether ``peer``'s uid, primary group or a supplementary group is on the allow lists."""
        return peer.uid in self.allow_uids or not self.allow_gids.isdisjoint((peer.gid, *peer.groups))

    def _refuse_now(self, conn: socket.socket, reason: str, code: str, message: str) -> None:
        self.metrics.refused_connections.labels(reason).inc()
        self._throttles[reason].warn("refusing a connection: %s: %s", code, message)
        try:
            # a new connection's send buffer is empty: the short frame goes whole, without waiting
            conn.send(encode(Error(str(code), message)))
        except OSError:
            conn.close()
            return
        if len(self.state.refusing) >= self.config.server.max_pending:
            conn.close()
            return
        self.state.refusing.add(conn)
        self._spawn(self._linger(conn), "refuse")

    async def _linger(self, conn: socket.socket) -> None:
        """Close a refused connection once the client hangs up (at most ``HANDSHAKE_TIMEOUT`` later):
        closed at once, a client whose Hello is still on its way fails to send it (EPIPE) and never
        reads the Error that says why."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                while await loop.sock_recv(conn, 65536):
                    pass
        except (TimeoutError, OSError):
            pass
        finally:
            self.state.refusing.discard(conn)
            conn.close()

    async def _handshake(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        peer = peer_description(conn)
        decoder = FrameDecoder(self.config.server.max_frame_bytes)
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                messages: list[object] = []
                while not messages:
                    data = await loop.sock_recv(conn, 65536)
                    if not data:
                        conn.close()
                        return
                    messages = list(decoder.feed(data))
        except TimeoutError:
            await self._refuse(conn, ErrorCode.BAD_MESSAGE, f"no hello within {HANDSHAKE_TIMEOUT:.0f} s")
            return
        except ProtocolError as err:
            self.metrics.protocol_errors.labels(err.code).inc()
            await self._refuse(conn, err.code, err.message)
            return
        except OSError:
            conn.close()
            return
        finally:
            # past its Hello (or gone), a connection no longer counts against max_pending
            self.state.pending.discard(conn)
        hello, rest = messages[0], messages[1:]
        if not isinstance(hello, Hello):
            self.metrics.protocol_errors.labels(ErrorCode.BAD_MESSAGE).inc()
            await self._refuse(conn, ErrorCode.BAD_MESSAGE, "the first message must be hello")
            return
        if hello.protocol_version != PROTOCOL_VERSION:
            await self._refuse(conn, ErrorCode.UNSUPPORTED_VERSION,
                               f"daemon speaks protocol {PROTOCOL_VERSION}, client {hello.protocol_version}")
            return
        # a disconnected session's slots are memory until its dispose has unmapped them: a new client
        # waits for that rather than push the daemon past the max_clients x slots it budgeted
        while self.state.disposing and len(self.state.sessions) + len(self.state.disposing) >= \
                self.sessions.clients:
            await asyncio.gather(*list(self.state.disposing), return_exceptions=True)
        if self.should_exit.is_set() or len(self.state.sessions) >= self.sessions.clients:
            self.metrics.refused_connections.labels("busy").inc()
            await self._refuse(conn, ErrorCode.BUSY, f"{counted(len(self.state.sessions), 'client')} connected "
                                                     f"(max_clients = {self.sessions.clients})")
            return
        if self.config.sampler.aggregation_cache and not hello.aggregation:
            self.metrics.refused_connections.labels("aggregation").inc()
            await self._refuse(conn, ErrorCode.BAD_REQUEST,
                               "this daemon's batches carry x_agg ([sampler] aggregation_cache = true), which the "
                               "client does not read (an older trainer); upgrade it or turn the cache off")
            return
        assert self._welcome_info is not None
        problem = task_refusal(self._welcome_info, hello.task)
        if problem is not None:
            self.metrics.refused_connections.labels("task").inc()
            await self._refuse(conn, ErrorCode.BAD_REQUEST, problem)
            return
        problem = self._job_problem(hello)
        if problem is not None:
            self.metrics.refused_connections.labels("job").inc()
            await self._refuse(conn, ErrorCode.BAD_REQUEST, problem)
            return
        session = self._new_session(peer, hello)
        if session is None:
            await self._refuse(conn, ErrorCode.INTERNAL, "cannot allocate shared memory for the slots")
            return
        problem = self._join_job(session, hello)
        if problem is not None:
            self._session_lost(session)
            self.metrics.refused_connections.labels("job").inc()
            await self._refuse(conn, ErrorCode.BAD_REQUEST, problem)
            return
        session.client_info = client_info(session, loggable(hello.client, CLIENT_NAME_CHARS), peer_credentials(conn))
        welcome = Welcome(protocol_version=PROTOCOL_VERSION, daemon_version=__version__, session=session.id,
                          dataset=self._welcome_info,
                          slots=SlotLayout(count=session.ring.count, slot_bytes=session.ring.slot_bytes,
                                           header_bytes=session.ring.header_bytes,
                                           segment_bytes=session.segment.nbytes),
                          feature_cache_rows=session.trainer_cache.rows if session.trainer_cache is not None else 0,
                          job=session.job.job.name or "" if session.job is not None else "", dealing=self._dealing)
        try:
            # the fd must ride on the first byte of Welcome; a fresh socket's send buffer takes it whole.
            # The client gets the read-only descriptor: with ours it could resize the memfd under our writes.
            socket.send_fds(conn, [encode(welcome)], [session.segment.reader_fd])
            log.info("session %d: %s connected (%s)", session.id, loggable(hello.client), peer)
            # the messages that came with the Hello are handled in connection_made, before any later byte
            await loop.connect_accepted_socket(
                lambda: ControlProtocol(session, decoder, self._session_lost, rest), conn)  # type: ignore[arg-type]
        except OSError as err:
            log.warning("session %d: handshake failed: %s", session.id, err)
            conn.close()
            self._session_lost(session)
            return

    async def _refuse(self, conn: socket.socket, code: str, message: str) -> None:
        self._throttles[f"refuse-{code}"].warn("refusing a connection: %s: %s", code, loggable(message))
        with contextlib.suppress(OSError):
            await asyncio.get_running_loop().sock_sendall(conn, encode(Error(str(code), message)))
        conn.close()

    def _job_problem(self, hello: Hello) -> str | None:
        """Why this daemon cannot serve the job rank a Hello describes, or None (also for a lone trainer)."""
        if not _in_job(hello):
            return None
        problem = job_mismatch(hello.job, hello.world_size, hello.local_world_size, hello.rank)
        if problem is not None:
            return problem
        if hello.local_world_size > self.sessions.clients:
            return (f"job {hello.job!r} has {hello.local_world_size} ranks on this machine but the daemon serves "
                    f"at most {counted(self.sessions.clients, 'client')} ([server] max_clients)")
        if hello.local_world_size < hello.world_size and self.mode is not None \
                and (mode_problem := self.mode.cross_machine_problem()) is not None:
            return (f"job {hello.job!r} spans machines ({hello.local_world_size} of {hello.world_size} ranks here): "
                    f"{mode_problem}")
        return None

    def _join_job(self, session: Session, hello: Hello) -> str | None:
        """Make ``session`` rank ``hello.rank`` of its job (creating the job with its first rank); a lone
        trainer's session is the one rank of a job of its own."""
        assert self._serving is not None
        if not _in_job(hello):
            lone = Job(None, 1, 1, self.ownership, self._serving, self.config.server.job_timeout, self._job_empty)
            lone.admit(session, 0, 1, 1)
            session.job = JobRank(lone, 0)
            return None
        job = self.state.jobs.get(hello.job)
        if job is None:
            job = Job(hello.job, hello.world_size, hello.local_world_size, self.ownership, self._serving,
                      self.config.server.job_timeout, self._job_empty)
            self.state.jobs[hello.job] = job
        problem = job.admit(session, hello.rank, hello.world_size, hello.local_world_size)
        if problem is not None:
            if not job.members:
                self._job_empty(job)
            return problem
        session.job = JobRank(job, hello.rank)
        return None

    def _job_empty(self, job: Job) -> None:
        if job.name is not None and self.state.jobs.get(job.name) is job:
            del self.state.jobs[job.name]

    def _new_session(self, peer: str, hello: Hello) -> Session | None:
        assert self._serving is not None
        count, slot_bytes = self.sessions.slots, self.sessions.slot_bytes
        try:
            segment = create_segment(count * slot_bytes, name=f"megabatch-session{self.state.next_session}")
        except ShmError as err:
            log.error("cannot create the slot segment: %s", err)
            return None
        ring = SlotRing(segment.mapping, count, slot_bytes, HEADER_BYTES)
        trainer_cache = None
        serving, info = self._serving, self._welcome_info
        assert info is not None
        # a job's ranks share one stream, whose batches go to several clients: no client cache is planned
        asked = 0 if _in_job(hello) else hello.feature_cache_bytes
        rows = accepted_rows(asked, info.num_nodes, serving.feat_dim, serving.value_dtype)
        if rows:
            trainer_cache = TrainerCache(info.num_nodes, rows, serving.feat_dim, serving.value_dtype)
            # not charged to [memory] budget (docs/CONFIG.md): 4 bytes per node per session with a cache
            log.info("session %d: planning a client feature cache of %s rows (%s asked; planner scratch %s)",
                     self.state.next_session, f"{rows:,}", format_size(hello.feature_cache_bytes),
                     format_size(trainer_cache.scratch_bytes))
        session = Session(self.state.next_session, peer, self._serving, segment, ring, self._open_eval,
                          trainer_cache)
        session.queues = hello.queue
        session.micro_batches = hello.micro_batches
        self.state.sessions[session.id] = session
        self.state.next_session += 1
        self.metrics.clients.set(len(self.state.sessions))
        return session

    def _session_lost(self, session: Session) -> None:
        if self.state.sessions.pop(session.id, None) is None:
            return
        self.metrics.clients.set(len(self.state.sessions))
        log.info("session %d: disconnected", session.id)
        if session.job is not None:
            session.job.job.member_left(session)  # also where the session never got past its handshake
        task = asyncio.ensure_future(self._dispose(session))
        task.set_name(f"megabatch-dispose-session{session.id}")
        self.state.tasks.add(task)
        self.state.disposing.add(task)
        task.add_done_callback(self.state.tasks.discard)
        task.add_done_callback(self.state.disposing.discard)

    async def _dispose(self, session: Session) -> None:
        await session.dispose()
        # a view of the slots caught in a reference cycle (a traceback, a closure) would keep the memfd
        # mapped, its pages charged to the daemon, until the cyclic collector happened to run
        gc.collect()

    def _slot_usage(self) -> tuple[int, int]:
        sessions = list(self.state.sessions.values())
        return sum(s.flow.in_use for s in sessions), sum(s.flow.count for s in sessions)
    def _open_eval(self) -> EvalAccess:
        assert self.mode is not None
        return self.mode.eval_access()

    def _start_pipeline(self, epoch: int, local: LocalRanks) -> TrainPipeline:
        assert self.mode is not None
        return self.mode.start_pipeline(epoch, local)
