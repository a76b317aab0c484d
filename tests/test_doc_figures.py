"""The figures the docs quote from a command, asserted by running that command as the doc
writes it (read out of the doc, only ``--out`` redirected to a scratch folder).

Tolerances: figures quoted to three significant digits are held to half a unit of their last
digit plus 0.5% (the runs are deterministic; the slack absorbs floating-point differences
between platforms, not modelling changes).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main

ROOT = Path(__file__).parent.parent


def _doc_command(doc: str, starts: str) -> list[str]:
    """The argv (after ``python -m simulator``) of the ```bash command of ``doc`` that
    starts with ``starts``."""
    found = [a for a in _doc_commands(doc, starts)]
    assert found, f"docs/{doc}: no command starting {starts!r}"
    return found[0]


def _run(argv: list[str], out: Path, monkeypatch) -> Path:
    monkeypatch.chdir(ROOT)  # the doc's relative paths
    if "--out" in argv:
        i = argv.index("--out")
        argv = argv[:i] + argv[i + 2:]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    return out


def close(value: float, quoted: float, rel: float = 0.005) -> bool:
    """``value`` agrees with a figure quoted to its last digit (see the module docstring)."""
    text = f"{quoted}"
    unit = 10 ** -(len(text.split(".")[1]) if "." in text else 0)
    return abs(value - quoted) <= unit / 2 + rel * abs(quoted)


def test_moe_deepseek_v3_saturated_figures(tmp_path, monkeypatch):
    """docs/moe.md, "End-to-end sanity": 950 decode-only steps of 870 sequences, 49.2 ms,
    all-to-all 36 %, 1,105 tokens/s per GPU; run TPOT 115 ms, 467 tokens/s per GPU."""
    argv = _doc_command("moe.md", "python -m simulator run workloads/moe-deepseek-v3")
    assert "--unset" in argv  # the file's rate_per_s would pace the clients (not saturated)
    out = _run(argv, tmp_path / "dsv3", monkeypatch)
    summary = json.loads((out / "summary.json").read_text())
    steps = pd.read_csv(out / "steps.csv")
    decode = steps[steps["prefill_tokens"] == 0]
    step_s = decode["end_s"] - decode["start_s"]
    assert len(decode) == 950
    assert close(decode["batch_size"].mean(), 870)
    assert close(step_s.mean() * 1e3, 49.2)
    assert close(100 * decode["a2a_s"].sum() / step_s.sum(), 36)
    per_gpu = decode["batch_size"].mean() / step_s.mean() / summary["gpus"]
    assert close(per_gpu, 1105)
    assert close(summary["tpot_mean_s"] * 1e3, 115)
    assert close(summary["throughput_tok_per_s"] / summary["gpus"], 467)


def _doc_commands(doc: str, contains: str):
    """The argvs of the ```bash commands of ``doc`` that contain ``contains``."""
    text = (ROOT / "docs" / doc).read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            if contains in line:
                yield shlex.split(line)[3:]


@pytest.fixture(scope="module")
def loads(tmp_path_factory):
    """docs/observability.md's under-loaded and saturated runs of the default scenario."""
    out = tmp_path_factory.mktemp("loads")
    with pytest.MonkeyPatch.context() as mp:
        return {name: _run(next(_doc_commands("observability.md", f"--out runs/{name}")),
                           out / name, mp) for name in ("underloaded", "saturated")}


def _table_rows(doc: str, first_cell: str) -> list[list[str]]:
    text = (ROOT / "docs" / doc).read_text()
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith(f"| {first_cell} |")]


@pytest.mark.parametrize("name", ["underloaded", "saturated"])
def test_observability_window_table(loads, name):
    """docs/observability.md's table of windows: queued, running, batch efficiency and its
    two parts, KV utilization, per quoted window end."""
    ts = pd.read_csv(loads[name] / "timeseries.csv")
    rows = _table_rows("observability.md", name)
    assert rows
    for end, queued, running, eff, seqs, tokens, kv in (r[1:] for r in rows):
        w = ts[ts["window_end_s"].round(6) == float(end)]
        assert len(w) == 1, end
        w = w.iloc[0]
        assert w["queue_len"] == int(queued) and w["running"] == int(running)
        for col, quoted in (("batch_efficiency", eff), ("batch_fill_seqs", seqs),
                            ("batch_fill_tokens", tokens), ("batch_fill_kv", kv)):
            assert close(w[col], float(quoted)), (name, end, col, w[col], quoted)


def test_observability_alert_events(loads):
    """docs/observability.md: no alert under-loaded; saturated, batch_efficiency_below
    never fires, the latency rules fire at 25, 32 and 32 s and waiting_ttft_above clears at
    57 s (cluster)."""
    assert pd.read_csv(loads["underloaded"] / "alerts.csv").empty
    a = pd.read_csv(loads["saturated"] / "alerts.csv")
    assert not (a["rule"] == "batch_efficiency_below").any()
    a = a[a["replica"] == "all"]
    got = {(r.rule, r.event): r.time_s for r in a.itertuples()}
    assert got == {("waiting_ttft_above", "fire"): 25.0, ("ttft_p99_above", "fire"): 32.0,
                   ("e2e_p99_above", "fire"): 32.0, ("waiting_ttft_above", "clear"): 57.0}


def _nvl72(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    assert main(["run", "workloads/moe-deepseek-v3-nvl72.toml", "--out", str(tmp_path / "n"),
                 "--quiet", "--no-trace", "--no-steps"]) == 0
    return json.loads((tmp_path / "n" / "summary.json").read_text()), pd.read_csv(
        tmp_path / "n" / "requests.csv")


def test_metrics_steady_nvl72_gap(tmp_path, monkeypatch, capsys):
    """docs/metrics.md, "Steady figures": the NVL72 run reads 16.8 req/s for the run and
    31.1 steady (window 6.7 s to 13.3 s), last reply at 23.9 s, TPOT 19.9 ms."""
    summary, requests = _nvl72(monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert close(summary["throughput_req_per_s"], 16.8)
    assert close(summary["goodput_steady_req_per_s"], 31.1)
    assert close(summary["simulated_time_s"], 23.9)
    assert close(summary["tpot_mean_s"] * 1e3, 19.9)
    assert ("steady window (s)              6.7 to 13.3 (the whole-run rates span 0.1 to "
            "23.9: warm-up and drain included)") in out
    assert "keeps up with 30.3 req/s offered" in out


def test_metrics_steady_sessions_window(tmp_path):
    """docs/metrics.md: the sessions example of docs/prefix-caching.md reads 1,084 tokens/s
    for the run and 2,041 in the steady window (31 s to 60 s), which ends at the last session
    start, not at the last arrival (116 s)."""
    import tomllib  # noqa: PLC0415

    import simulator  # noqa: PLC0415

    text = (ROOT / "docs" / "prefix-caching.md").read_text()
    block = re.search(r"```toml\n(.*?)```", text[text.index("## Synthetic sessions"):], re.S)
    res = simulator.run({**tomllib.loads(block.group(1)), "name": "sessions"},
                        keep_steps=False)
    s = res.summary
    assert close(s["throughput_tok_per_s"], 1084)
    assert close(s["throughput_steady_tok_per_s"], 2041)
    t = res.requests["arrival_s"]
    # Ends at the last session start (before 60 s), long before the last arrival.
    end = float(t.min()) + 2 * s["steady_window_s"]
    assert close(end, 60) and close(float(t.max()), 116)
    assert close(end - s["steady_window_s"], 31)
