"""Who holds the training pipeline when its holder is on its way out: a trainer restarted the moment its
predecessor died must not be refused by that predecessor's teardown (``loader.daemon.ownership``), and a
holder that is still there refuses a trainer that does not queue at once, as before."""

import asyncio
import socket
from dataclasses import dataclass, field

from loader.daemon.metrics import DaemonMetrics
from loader.daemon.ownership import PipelineOwnership
from loader.daemon.peers import peer_hung_up
from loader.sampling.ranks import SINGLE_RANK


@dataclass(eq=False)
class FakeOwner:
    label: str
    queues: bool = False
    closed: bool = False
    leaving: bool = False
    notices: list[tuple[int, str]] = field(default_factory=list)

    def tell_queued(self, position: int, holder: str) -> None:
        self.notices.append((position, holder))


class FakePipeline:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


def ownership(leaving_grace: float = 60.0) -> PipelineOwnership:
    return PipelineOwnership(lambda epoch, local: FakePipeline(epoch),  # type: ignore[arg-type,return-value]
                             idle_timeout=60.0, metrics=DaemonMetrics(),
                             leaving_grace=leaving_grace)


def test_a_trainer_that_does_not_queue_is_refused_at_once_while_the_holder_is_there():
    async def run():
        pipelines = ownership()
        holder, other = FakeOwner("session 1"), FakeOwner("session 2")
        assert isinstance(await pipelines.acquire(holder, 0, SINGLE_RANK), FakePipeline)
        refusal = await pipelines.acquire(other, 0, SINGLE_RANK)
        assert refusal == "session 1 is training; one training stream at a time"
        assert pipelines.owner is holder and other.notices == []
    asyncio.run(run())


def test_a_holder_on_its_way_out_hands_over_to_a_trainer_that_does_not_queue():
    async def run():
        pipelines = ownership()
        holder, successor = FakeOwner("session 1"), FakeOwner("session 2")
        first = await pipelines.acquire(holder, 0, SINGLE_RANK)
        holder.leaving = True  # its trainer died; the daemon has not torn its session down yet
        asking = asyncio.ensure_future(pipelines.acquire(successor, 0, SINGLE_RANK))
        await asyncio.sleep(0)  # one turn: the request runs to its first suspension (a refusal would end it)
        assert not asking.done() and pipelines.owner is holder
        pipelines.release(holder)  # the teardown ends
        second = await asking
        assert isinstance(second, FakePipeline) and second is not first
        assert first.stopped and pipelines.owner is successor and successor.notices == []
    asyncio.run(run())


def test_a_holder_that_never_lets_go_gets_the_trainer_refused_after_the_grace():
    async def run():
        pipelines = ownership(leaving_grace=0.01)
        holder, successor = FakeOwner("session 1", closed=True, leaving=True), FakeOwner("session 2")
        await pipelines.acquire(holder, 0, SINGLE_RANK)
        refusal = await pipelines.acquire(successor, 0, SINGLE_RANK)
        assert refusal == "session 1 is training; one training stream at a time"
        assert pipelines.owner is holder
    asyncio.run(run())


def test_a_leaving_holder_does_not_jump_the_line():
    """With trainers already queued, the pipeline a leaving holder gives up is theirs: one that does not
    queue is refused at once, as behind any line."""
    async def run():
        pipelines = ownership()
        holder, queued, other = FakeOwner("session 1"), FakeOwner("session 2", queues=True), FakeOwner("session 3")
        await pipelines.acquire(holder, 0, SINGLE_RANK)
        waiting = asyncio.ensure_future(pipelines.acquire(queued, 0, SINGLE_RANK))
        while not queued.notices:
            await asyncio.sleep(0)
        holder.leaving = True
        refusal = await pipelines.acquire(other, 0, SINGLE_RANK)
        assert refusal == "session 1 is training; 1 waiting; one training stream at a time"
        pipelines.release(holder)
        assert isinstance(await waiting, FakePipeline) and pipelines.owner is queued
    asyncio.run(run())


def test_peer_hung_up_reads_the_kernels_word_on_a_socket():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        assert not peer_hung_up(ours.fileno())
        theirs.sendall(b"unread bytes")
        assert not peer_hung_up(ours.fileno())  # data waiting is not a hang-up
        theirs.close()
        assert peer_hung_up(ours.fileno())  # closed, its last bytes still unread
        assert ours.recv(64) == b"unread bytes"


def test_a_half_close_is_a_hang_up_as_the_session_ends_at_its_eof():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        theirs.shutdown(socket.SHUT_RD)  # the peer stops reading only: it can still send, it is not leaving
        assert not peer_hung_up(ours.fileno())
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        theirs.shutdown(socket.SHUT_WR)
        assert peer_hung_up(ours.fileno())
        ours.sendall(b"still readable")  # half-open: the peer could read on, but the daemon closes at this EOF
        assert theirs.recv(64) == b"still readable"
