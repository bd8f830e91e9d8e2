"""launch.bench's table, JSON file and ratio convention."""

import json
import subprocess
import sys

from launch import bench
from launch.benches import common


def test_ratio_convention():
  assert common.Row("tps", rlpt=300.0, baseline=100.0).ratio == 3.0
  lat = common.Row("p50", rlpt=0.1, baseline=0.4, higher_is_better=False)
  assert lat.ratio == 4.0
  assert common.Row("x", rlpt=1.0, baseline=None).ratio is None


def test_table_and_json(tmp_path):
  rows = [common.Row("a", 2.0, 1.0, unit="tok/s"), common.Row("b", 1.0, None)]
  text = common.format_rows("bench t", rows)
  assert "2.00x" in text and "tok/s" in text
  path = tmp_path / "out.json"
  common.write_json(str(path), rows, benchmark="t")
  data = json.loads(path.read_text())
  assert data["rows"][0] == {"name": "a", "rlpt": 2.0, "baseline": 1.0, "ratio": 2.0,
                             "unit": "tok/s", "note": ""}
  assert data["rows"][1]["ratio"] is None


def test_percentile():
  xs = list(range(101))
  assert common.percentile(xs, 50) == 50
  assert common.percentile(xs, 99) == 99
  assert common.percentile([1.0, 2.0], 50) == 1.5


def test_unknown_benchmark_lists_available():
  r = subprocess.run([sys.executable, "-m", "launch.bench", "no_such_bench"],
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 2
  assert "unknown benchmark 'no_such_bench'" in r.stderr
  for name in bench.available():
    assert name in r.stderr
