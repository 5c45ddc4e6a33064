"""prepare keeps its peak RSS within --memory-budget + FIXED_OVERHEAD_BYTES on a graph whose
features are 4x the budget. The child process reports its own high-water mark."""

import json
import subprocess
import sys

import pytest

from loader.offline.generate import generate_graph
from loader.offline.prepare import FIXED_OVERHEAD_BYTES

BUDGET = 64 << 20
REPORT = """
import json, sys
from loader.cli import main
from proto.progress import peak_rss_bytes
code = main(sys.argv[1:])
print(json.dumps({"code": code, "maxrss": peak_rss_bytes()}))
"""


@pytest.mark.parametrize("partitioner", ["stream", "random"])
def test_prepare_peak_rss_within_budget(tmp_path_factory, partitioner):
    tmp = tmp_path_factory.mktemp("mem")
    raw = tmp / "raw"
    # 270k x 256 float32 = 276 MB of features: over 4x the 64 MiB budget
    generate_graph(raw, num_nodes=270_000, avg_degree=10, feat_dim=256, num_classes=8, progress=False)
    assert (raw / "features.npy").stat().st_size >= 4 * BUDGET
    run = subprocess.run([sys.executable, "-c", REPORT, "--no-progress", "-q", "prepare", str(raw), str(tmp / "ds"),
                          "--partitions", "60", "--partitioner", partitioner, "--memory-budget", str(BUDGET)],
                         capture_output=True, text=True)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, run.stderr
    assert result["maxrss"] <= BUDGET + FIXED_OVERHEAD_BYTES, (
        f"peak RSS {result['maxrss'] >> 20} MiB > budget {BUDGET >> 20} MiB + {FIXED_OVERHEAD_BYTES >> 20} MiB")
