"""What an epoch shows while it runs (``trainer.progress``): counted against the stream's own batch count,
never past 100%, as log lines without a terminal and as a bar on one."""

import io
import logging
import re
from collections.abc import Iterator

import pytest
import torch

from trainer.batch import Batch
from trainer.loop import TrainConfig, train
from trainer.progress import EpochProgress, finished_line, format_duration
from trainer.source import BatchSource, SourceInfo

STEP = re.compile(r"^epoch (\d+)/(\d+): step (\d+)(?:/(\d+) \((\d+)%\))?, [\d,]+ samples/s, data-wait \d+\.\d%"
                  r"(?:, ETA \d+:\d\d)?$")


class Clock:
    """A clock the test moves by hand: progress lines are due by time, and the test decides the time."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def progress_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "megabatch.trainer" and ": step " in r.getMessage()]


def test_lines_come_every_interval_with_rate_wait_share_and_eta(caplog):
    caplog.set_level(logging.INFO, logger="megabatch.trainer")
    clock = Clock()
    bar = EpochProgress(3, 10, interval_s=10.0, tty=False, clock=clock)
    for _ in range(4):
        clock.now += 3.0
        bar.update(12, samples=100, wait_s=1.0, step_s=2.0)
    bar.close()
    # 3 s per step: the first line is due at the fourth step (12 s in), none before
    assert progress_lines(caplog) == ["epoch 3/10: step 4/12 (33%), 33 samples/s, data-wait 33.3%, ETA 0:24"]


def test_the_total_is_the_streams_and_grows_rather_than_pass_100_percent(caplog):
    caplog.set_level(logging.INFO, logger="megabatch.trainer")
    clock = Clock()
    bar = EpochProgress(1, 2, interval_s=0.0, tty=False, clock=clock)
    # a stream that says 2 batches and publishes 3: the total follows the steps, it never ends at 150%
    for _ in range(3):
        clock.now += 1.0
        bar.update(2, samples=10, wait_s=0.0, step_s=1.0)
    steps = [STEP.match(line) for line in progress_lines(caplog)]
    assert all(steps), progress_lines(caplog)
    assert [(m.group(3), m.group(4), m.group(5)) for m in steps if m] == [("1", "2", "50"), ("2", "2", "100"),
                                                                         ("3", "3", "100")]
    assert bar.percent() == 100.0


def test_without_a_total_it_shows_the_steps_only(caplog):
    caplog.set_level(logging.INFO, logger="megabatch.trainer")
    bar = EpochProgress(1, 1, interval_s=0.0, tty=False, clock=Clock())
    bar.update(None, samples=8, wait_s=0.0, step_s=0.0)
    assert progress_lines(caplog) == ["epoch 1/1: step 1, 0 samples/s, data-wait -"]
    assert bar.percent() is None


def test_the_terminal_bar_ends_at_100_percent_on_a_line_of_its_own():
    out, clock = io.StringIO(), Clock()
    with EpochProgress(2, 5, tty=True, stream=out, clock=clock) as bar:
        for _ in range(60):
            clock.now += 1.0
            bar.update(60, samples=4, wait_s=0.1, step_s=0.3)
    drawn = out.getvalue()
    assert drawn.endswith("\n") and drawn.count("\n") == 1
    frames = [frame.rstrip() for frame in drawn.rstrip("\n").split("\r") if frame]
    assert frames[-1].startswith("epoch 2/5 [########################] step 60/60 (100%), 4 samples/s, "
                                 "data-wait 25.0%, ETA 0:00"), frames[-1]
    assert max(int(p) for frame in frames for p in re.findall(r"\((\d+)%\)", frame)) == 100


def test_disabled_progress_shows_nothing_but_still_counts(caplog):
    caplog.set_level(logging.INFO, logger="megabatch.trainer")
    out = io.StringIO()
    with EpochProgress(1, 1, enabled=False, interval_s=0.0, stream=out) as bar:
        bar.update(3, samples=1, wait_s=0.0, step_s=0.0)
    assert out.getvalue() == "" and progress_lines(caplog) == [] and bar.done == 1


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (7.4, "0:07"), (754, "12:34"), (3723, "1:02:03")])
def test_durations_read_as_a_clock(seconds, text):
    assert format_duration(seconds) == text


class Overpublishing(BatchSource):
    """Batches of 8 seeds over ``train_nodes`` 16 (an estimate of 2 batches) in streams of ``batches``
    batches, each of which says so (``stream_batches``), or says nothing (``known=False``): the shape of a
    hierarchical epoch, whose mega-batches each end on a short batch."""

    def __init__(self, batches: int, known: bool) -> None:
        self.batches, self.known = batches, known

    @property
    def info(self) -> SourceInfo:
        return SourceInfo(num_features=4, num_classes=2, num_hops=1, batch_size=8, train_nodes=16,
                          description="over-publishing", train_class_counts=(8, 8))

    def _stream(self, count: int) -> Iterator[Batch]:
        gen = torch.Generator().manual_seed(count)
        for seq in range(count):
            yield Batch(x=torch.randn(16, 4, generator=gen), y=torch.randint(0, 2, (8,), generator=gen),
                        edge_index=torch.stack([torch.arange(8, 16), torch.arange(8)]), n_id=torch.arange(16),
                        num_sampled_nodes=[8, 8], num_sampled_edges=[8], seq=seq,
                        stream_batches=count if self.known else None)

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        return self._stream(self.batches)

    def eval_batches(self, split: str) -> Iterator[Batch]:
        return self._stream(1)


@pytest.mark.parametrize("known", [True, False])
def test_the_loop_counts_the_batches_the_stream_publishes_not_the_estimate(caplog, known):
    caplog.set_level(logging.INFO, logger="megabatch.trainer")
    result = train(Overpublishing(3, known), TrainConfig(hidden=8, epochs=2), progress=True, progress_interval=0.0,
                   log=lambda line: None)
    matches = [STEP.match(line) for line in progress_lines(caplog)]
    assert all(matches) and len(matches) == 6, progress_lines(caplog)
    shown = [(int(m.group(1)), int(m.group(3)), m.group(4), m.group(5)) for m in matches if m]
    if known:
        # 3 batches where the seed count suggests 2: 3/3 at 100%, never 3/2 at 150%
        assert shown == [(e, s, "3", str(round(100 * s / 3))) for e in (1, 2) for s in (1, 2, 3)]
    else:
        assert shown == [(e, s, None, None) for e in (1, 2) for s in (1, 2, 3)]
    assert [r.batches for r in result.epochs] == [3, 3]


def test_finished_line_sums_this_runs_epochs():
    result = train(Overpublishing(2, True), TrainConfig(hidden=8, epochs=2), log=lambda line: None)
    line = finished_line(result)
    samples = sum(r.samples for r in result.epochs)
    assert samples == 32
    assert re.fullmatch(r"training finished: 2 epochs \(last epoch 2\), 32 samples in \d+\.\d s of training "
                        r"\([\d,]+ samples/s\), data-wait \d+\.\d%", line), line
    result.resumed_from_epoch = 1  # the first epoch came from a checkpoint: not this run's work
    assert finished_line(result).startswith("training finished: 1 epoch (last epoch 2), 16 samples in ")
