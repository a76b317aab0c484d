"""``python -m simulator`` leaves without tearing its objects down (``os._exit`` after the
streams are flushed): what it printed and wrote must be whole, and its exit status kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import tomli_w

from simulator.cli import main
from tests.conftest import toy_scenario

ROOT = Path(__file__).parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_run_prints_and_writes_all_of_it_before_leaving(tmp_path, capsys):
    sc = toy_scenario(workload={"num_requests": 20})
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(sc))
    proc = _cli("run", str(path), "--out", str(tmp_path / "cli"))
    assert proc.returncode == 0, proc.stderr
    assert main(["run", str(path), "--out", str(tmp_path / "inproc")]) == 0
    inproc = capsys.readouterr().out
    # The same printout, to its last line (less the wall time and the folder's name):
    # nothing left behind in a buffer.
    def lines(text: str, folder: str) -> list[str]:
        return [x.replace(folder, "OUT") for x in text.splitlines()
                if not x.strip().startswith("wall time")]
    assert lines(proc.stdout, "cli") == lines(inproc, "inproc")
    assert proc.stdout.rstrip().endswith("cli/")
    for name in ("requests.csv", "steps.csv", "timeseries.csv"):
        assert ((tmp_path / "cli" / name).read_bytes()
                == (tmp_path / "inproc" / name).read_bytes()), name
    summaries = [json.loads((tmp_path / d / "summary.json").read_text())
                 for d in ("cli", "inproc")]
    for s in summaries:
        s.pop("wall_time_s")
    assert summaries[0] == summaries[1]


def test_a_bad_scenario_still_exits_2_with_its_message(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(tomli_w.dumps(toy_scenario(model={"name": "nope"})))
    proc = _cli("run", str(path), "--quiet")
    assert proc.returncode == 2
    assert "model.name: unknown model 'nope'" in proc.stderr
