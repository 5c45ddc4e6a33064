"""Mode "staged" stops promptly: a stream stopped while its superbatch is being staged ends the pass within a chunk,
publishes nothing of that superbatch and gives its staging and spill files back."""

import threading

import numpy as np

from proto.client import ControlClient
from proto.messages import Credit, StartEpoch
from tests.daemon_harness import daemon_config, running_daemon


def test_stopping_a_stream_mid_superbatch_stops_its_staging_pass(dataset_3k, tmp_path, monkeypatch):
    """The trainer leaves, then the daemon stops (SIGTERM's path), while the third chunk of the first superbatch's
    pass is being read: the read waits until the stream's stop is set (by the pipeline's stop, not by the mode's
    close, which comes after it), and then the pass reads at most one chunk more of the dozens it had left."""
    from loader.daemon.fullgraph import outofcore, staged
    from loader.staging import window_plan
    from loader.staging.sequential_reader import SequentialReader

    # every chunk staged, in chunks of a page: a pass of dozens of chunks over the 3000 rows
    monkeypatch.setattr(window_plan, "chunk_costs", lambda keys, shift, chunks, *args: (np.zeros(chunks),
                                                                                        np.ones(chunks)))
    monkeypatch.setattr(outofcore, "STAGING_CHUNK", 4096)
    monkeypatch.setattr(outofcore, "STAGING_CHUNK_SMALL", 4096)
    streams: list[threading.Event] = []
    start_stream = staged.StagedMode.start_stream

    def recorded_stream(self, stopped):
        streams.append(stopped)
        return start_stream(self, stopped)

    passes: list[int] = []  # chunks of each window's pass
    stage_window = staged.StagedMode._stage_window

    def recorded_window(self, plan, stopped):
        passes.append(len(plan.chunk_runs()[0]))
        return stage_window(self, plan, stopped)

    outcomes: list[tuple[str, bool, bool]] = []  # (how staging ended, spill file given back, no staging file in use)
    stage = staged.StagedMode.stage

    def recorded_stage(self, sampled, stopped=None):
        try:
            rows = stage(self, sampled, stopped)
        except BaseException as err:
            files = self.stager._files
            outcomes.append((type(err).__name__, not sampled.spill._closer.alive, len(files._open) == files.kept))
            raise
        outcomes.append(("staged", False, False))
        return rows

    reads: list[int] = []
    reached = threading.Event()
    stopped_in_time: list[bool] = []
    read_chunk = SequentialReader._read_chunk

    def counted(self, buffer, at, need):
        reads.append(at)
        if len(reads) == 3:
            reached.set()
            stopped_in_time.append(streams[-1].wait(60))
        return read_chunk(self, buffer, at, need)

    monkeypatch.setattr(staged.StagedMode, "start_stream", recorded_stream)
    monkeypatch.setattr(staged.StagedMode, "_stage_window", recorded_window)
    monkeypatch.setattr(staged.StagedMode, "stage", recorded_stage)
    monkeypatch.setattr(SequentialReader, "_read_chunk", counted)
    (tmp_path / "staging").mkdir()
    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": "staged"},
                           fullgraph={"superbatch": 64, "feature_cache": 0,
                                      "staging_dir": str(tmp_path / "staging")},
                           memory={"budget": "512M"})
    with running_daemon(config):
        client = ControlClient.connect(str(config.server.socket), client="test", timeout=30)
        try:
            client.send(Credit(count=client.welcome.slots.count))
            client.send(StartEpoch(epoch=0))
            assert reached.wait(60)  # the first superbatch's pass is under way
        finally:
            client.close()
    assert stopped_in_time == [True]
    assert len(passes) == 1 and passes[0] > 20
    assert 3 <= len(reads) <= 4 < passes[0]
    assert outcomes == [("PassStopped", True, True)]  # nothing of it published, its files given back
    assert not list((tmp_path / "staging").iterdir())
