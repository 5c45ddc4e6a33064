"""The soak's well-behaved clients: the good trainer (``GoodClient``), which checks every batch against the
dataset, and the ``Hog``, which takes the training pipeline and is evicted for ``stall_timeout`` or
``idle_timeout``; what each saw is counted in a ``Tally``."""

import collections
import random
import threading
import time

import numpy as np

from bench.soak_settings import EPOCHS_PER_SESSION, HOG_PAUSE, IDLE_TIMEOUT, NO_PROGRESS_SECONDS, STALL_TIMEOUT
from loader.sampling.inmemory import InMemoryGraph
from proto.client import ControlClient, DaemonShuttingDown
from proto.errors import ConnectFailed, ConnectionClosed, ProtocolError, RemoteError, SlotError
from proto.messages import BatchReady, Credit, EpochEnd, EvalEnd, EvalRequest, Message, Release, StartEpoch


class Tally:
    """What a client saw: expected ``events`` and unexpected ``errors``, a few examples of each error."""

    def __init__(self) -> None:
        self.events: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.examples: dict[str, str] = {}

    def error(self, kind: str, detail: object) -> None:
        self.errors[kind] += 1
        self.examples.setdefault(kind, str(detail)[:300])


def connect(path: str, name: str, tally: Tally) -> ControlClient | None:
    try:
        return ControlClient.connect(path, client=name, timeout=30)
    except RemoteError as err:
        # busy: max_clients or max_pending is full (the hostile client's burst does that on purpose)
        tally.events[f"connect refused: {err.code}"] += 1
    except (ConnectFailed, ConnectionClosed, TimeoutError, ProtocolError, OSError) as err:
        tally.error(f"connect: {type(err).__name__}", err)
    return None


class GoodClient(threading.Thread):
    """Trains and evaluates as a trainer does, checking every batch, reconnecting when refused."""

    def __init__(self, path: str, reference: InMemoryGraph | None, stop: threading.Event, seed: int) -> None:
        super().__init__(name="soak-good", daemon=True)
        self.path, self.reference, self.stop = path, reference, stop
        self.rng = random.Random(seed)
        self.tally = Tally()
        self.batches: collections.Counter[str] = collections.Counter()
        self.epoch = 0
        self._next_seq = 0

    def run(self) -> None:
        while not self.stop.is_set():
            client = connect(self.path, "soak-good", self.tally)
            if client is None:
                self.stop.wait(0.3)
                continue
            self.tally.events["sessions"] += 1
            try:
                self.session(client, EPOCHS_PER_SESSION)
            except RemoteError as err:
                # a fatal error for a client that reads and releases everything: evicted, internal, corrupt
                self.tally.error(f"daemon error {err.code}", err)
            except DaemonShuttingDown as err:
                self.tally.error("daemon shutting down", err)
            except (ConnectionClosed, ProtocolError, SlotError, TimeoutError, OSError) as err:
                self.tally.error(type(err).__name__, err)
            except Exception as err:  # a bug of this script must not end the soak unnoticed: it is reported
                self.tally.error(f"soak bug: {type(err).__name__}", err)
            finally:
                client.close("soak: session done")

    def session(self, client: ControlClient, epochs: int, evals: tuple[str, ...] = ()) -> None:
        """Train ``epochs`` epochs (evaluating after each, and while another session trains) then the ``evals``."""
        self._next_seq = 0
        client.send(Credit(count=client.welcome.slots.count))
        trained = 0
        while trained < epochs and not self.stop.is_set():
            result = self.stream(client, StartEpoch(epoch=self.epoch))
            if result == "done":
                self.epoch += 1
                trained += 1
                self.tally.events["epochs"] += 1
            elif result == "refused":
                self.tally.events["StartEpoch refused: another session trains"] += 1
            if self.stream(client, EvalRequest(split=self.rng.choice(("val", "test")))) == "done":
                self.tally.events["evaluations"] += 1
        for split in evals:
            if self.stream(client, EvalRequest(split=split)) == "done":
                self.tally.events["evaluations"] += 1

    def stream(self, client: ControlClient, request: StartEpoch | EvalRequest) -> str:
        """One stream to its end: "done", "refused" (a non-fatal bad_request) or "stopped"."""
        client.send(request)
        end_type = EpochEnd if isinstance(request, StartEpoch) else EvalEnd
        count, last = 0, time.monotonic()
        while True:
            if self.stop.is_set():
                return "stopped"
            try:
                msg = client.recv(timeout=1.0)
            except TimeoutError:
                if time.monotonic() - last > NO_PROGRESS_SECONDS:
                    raise TimeoutError(f"no message for {NO_PROGRESS_SECONDS:g} s in a {request.TAG} stream") \
                        from None
                continue
            except RemoteError as err:
                if err.fatal:
                    raise
                if "is training" not in err.message:
                    self.tally.error("unexpected bad_request", err)
                return "refused"
            last = time.monotonic()
            if isinstance(msg, BatchReady):
                if msg.seq != self._next_seq:
                    self.tally.error("seq gap", f"BatchReady seq {msg.seq}, expected {self._next_seq}")
                self._next_seq = msg.seq + 1
                self.check(client, msg)
                client.send(Release(slot=msg.slot, seq=msg.seq))
                count += 1
                self.batches[msg.kind] += 1
            elif isinstance(msg, end_type):
                if msg.batches != count:
                    self.tally.error("end count", f"{msg} after {count} batches")
                return "done"
            else:
                self.tally.error("unexpected message", msg)

    def check(self, client: ControlClient, msg: BatchReady) -> None:
        """The batch against the dataset; views are dropped before the caller releases the slot."""
        arrays = client.read_batch(msg).arrays
        n_id, x, y, edges = arrays["n_id"], arrays["x"], arrays["y"], arrays["edge_index"]
        seeds = int(arrays["nodes_per_hop"][0])
        if edges.size and (int(edges.min()) < 0 or int(edges.max()) >= n_id.shape[0]):
            self.tally.error("wrong batch", f"seq {msg.seq}: edge_index outside [0, {n_id.shape[0]})")
        if self.reference is not None and not (np.array_equal(x, self.reference.features[n_id])
                                               and np.array_equal(y, self.reference.labels[n_id[:seeds]])):
            self.tally.error("wrong batch", f"seq {msg.seq} ({msg.kind}): x or y differ from the dataset")


class Hog(threading.Thread):
    """Takes the training pipeline and never gives it back by itself: stalls, or idles after an epoch."""

    def __init__(self, path: str, stop: threading.Event) -> None:
        super().__init__(name="soak-hog", daemon=True)
        self.path, self.stop = path, stop
        self.tally = Tally()
        self.latency: dict[str, list[float]] = {"stall": [], "idle": []}
        """Seconds from the hog's last sign of life (last batch received or EpochEnd) to its eviction."""
        self.epoch = 1_000_000  # other epochs than the good client's: every handover restarts the pipeline

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            client = connect(self.path, "soak-hog", self.tally)
            if client is None:
                self.stop.wait(0.3)
                continue
            variant = ("stall", "idle")[turn % 2]
            turn += 1
            try:
                self.hog(client, variant)
            except RemoteError as err:
                self.tally.error(f"daemon error {err.code}", err)
            except (ConnectionClosed, ProtocolError, SlotError, TimeoutError, OSError) as err:
                self.tally.error(type(err).__name__, err)
            except Exception as err:  # a bug of this script must not end the soak unnoticed: it is reported
                self.tally.error(f"soak bug: {type(err).__name__}", err)
            finally:
                client.close()
            # a trainer restarting after a crash; without it the hog re-takes the pipeline before the good
            # client's next StartEpoch nearly every time (the daemon hands it to whoever asks first)
            self.stop.wait(HOG_PAUSE)

    def recv(self, client: ControlClient, limit: float) -> Message | None:
        """The next message within ``limit`` seconds; None when stopping. Errors raise ``RemoteError``."""
        deadline = time.monotonic() + limit
        while not self.stop.is_set():
            try:
                return client.recv(timeout=1.0)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nothing from the daemon for {limit:g} s") from None
        return None

    def hog(self, client: ControlClient, variant: str) -> None:
        client.send(Credit(count=client.welcome.slots.count))
        first: Message | None = None
        while first is None:
            if self.stop.is_set():
                return
            client.send(StartEpoch(epoch=self.epoch))
            try:
                first = self.recv(client, NO_PROGRESS_SECONDS)
            except RemoteError as err:
                if err.fatal:
                    raise
                self.tally.events["StartEpoch refused: another session trains"] += 1
                self.stop.wait(0.5)
                first = None
        self.epoch += 1
        self.tally.events[f"owned the pipeline ({variant})"] += 1
        msg: Message | None = first
        last = time.monotonic()
        limit = STALL_TIMEOUT + IDLE_TIMEOUT + NO_PROGRESS_SECONDS
        try:
            while msg is not None:
                if isinstance(msg, BatchReady):
                    self.tally.events["batches taken"] += 1
                    if variant == "idle":
                        client.send(Release(slot=msg.slot, seq=msg.seq))
                elif isinstance(msg, EpochEnd):
                    self.tally.events["epochs finished"] += 1
                else:
                    self.tally.error("unexpected message", msg)
                last = time.monotonic()
                msg = self.recv(client, limit)
        except RemoteError as err:
            latency = time.monotonic() - last
            if err.code != "timeout":
                raise
            reason = "stall" if "stall_timeout" in err.message else "idle" if "idle_timeout" in err.message else None
            if reason != variant:
                self.tally.error(f"evicted for {reason} while {variant}ing", err)
            if reason is not None:
                self.latency[reason].append(latency)
            self.tally.events[f"evicted ({reason})"] += 1

