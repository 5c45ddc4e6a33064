"""The line of trainers waiting for the training pipeline, first come first served.

The rules of who holds the pipeline and who waits are ``loader.daemon.ownership``'s; this is only the
line itself: arrival order, places told by ``Queued`` (on every change and every few seconds, so a
waiting client's read timeout sees traffic), a place given up when the waiter leaves.
"""

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["TrainingQueue", "QUEUE_NOTICE_SECONDS"]

QUEUE_NOTICE_SECONDS = 10.0
"""A waiting trainer hears its place at least this often (a client's read timeout must see traffic)."""


@dataclass(eq=False)
class _Ticket:
    owner: object
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class TrainingQueue:
    """Owners (sessions or jobs) waiting for the training pipeline, in arrival order (lives on the event loop)."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._tickets: list[_Ticket] = []
        self._on_change = on_change

    @property
    def waiting(self) -> list[object]:
        """The waiting owners, next first."""
        return [ticket.owner for ticket in self._tickets]

    def __len__(self) -> int:
        return len(self._tickets)

    async def wait_turn(self, owner: object, free_for: Callable[[object], bool], holder: Callable[[], str],
                        notify: Callable[[int, str], None]) -> None:
        """Return once ``owner`` is first in line and ``free_for(owner)``; meanwhile ``notify(position,
        holder())`` on arrival, on every change and every ``QUEUE_NOTICE_SECONDS``. Cancelling the wait (the
        trainer left) gives the place up."""
        ticket = _Ticket(owner)
        self._tickets.append(ticket)
        self._on_change()
        try:
            while not (self._tickets[0] is ticket and free_for(owner)):
                notify(self._tickets.index(ticket) + 1, holder())
                ticket.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(QUEUE_NOTICE_SECONDS):
                        await ticket.wake.wait()
        finally:
            self._tickets.remove(ticket)
            self.wake()
            self._on_change()

    def wake(self) -> None:
        """The pipeline may be free, or the line moved: every waiter looks again (and hears its place)."""
        for ticket in self._tickets:
            ticket.wake.set()
