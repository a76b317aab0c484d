"""What commands write from hostile names and folders, and the documented caps.

report.html escapes every key and name; a ``$`` in a name is drawn as text, never TeX;
``calibrate fit`` without ``--out`` writes where ``--gpu`` says, never where the GPU file's
``name`` says; a resumed sweep refuses a foreign CSV without touching it; every cap that
docs/scenario.md quotes is the one the code holds.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import tomli_w
from conftest import toy_scenario

from simulator import arguments, files
from simulator.calibration import commands as calibrate
from simulator.calibration import moe_fit
from simulator.cli import main
from simulator.io.schema import MAX_REQUESTS, MAX_TIME_S, MAX_TOKENS
from simulator.model.config_fields import FIELD_DEFAULT_MAX, FIELD_MAX
from simulator.model.routing import MAX_EXPERTS
from simulator.sweep import MAX_RUNS
from simulator.topology.measure import MAX_BYTES
from simulator.workload.sessions import MAX_HASHES

ROOT = Path(__file__).parents[1]
TOY = toy_scenario(workload={"arrival": "constant", "rate_per_s": 10.0, "num_requests": 4,
                             "prompt_tokens": 100, "output_tokens": 3})


def _run_folder(tmp_path: Path) -> Path:
    (tmp_path / "s.toml").write_text(tomli_w.dumps(TOY))
    out = tmp_path / "r"
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(out), "--quiet"]) == 0
    return out


def test_report_escapes_every_summary_key_and_name(tmp_path, capsys):
    run = _run_folder(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    summary["<script>alert(1)</script>"] = "<img src=x onerror=alert(2)>"
    (run / "summary.json").write_text(json.dumps(summary))
    scenario = (run / "scenario.toml").read_text().replace('name = "toy"',
                                                           'name = "</title><b>x"')
    assert "<b>x" in scenario
    (run / "scenario.toml").write_text(scenario)
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "<script>" not in page and "<img src=x" not in page and "<b>x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;/title&gt;&lt;b&gt;x" in page


def test_a_dollar_in_a_name_is_drawn_as_text(tmp_path, capsys):
    run = _run_folder(tmp_path)
    # Unbalanced TeX: mathtext would fail to parse it when the figure is drawn.
    scenario = (run / "scenario.toml").read_text().replace('name = "toy"',
                                                           'name = "a$\\\\frac{x$b"')
    assert "frac" in scenario
    (run / "scenario.toml").write_text(scenario)
    assert main(["plot", str(run)]) == 0
    assert (run / "latency_cdf.png").stat().st_size > 0
    other = tmp_path / "$x^$"
    shutil.copytree(run, other)
    assert main(["compare", str(run), str(other), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "compare_cdf.png").stat().st_size > 0


def test_calibrate_fit_writes_where_gpu_says_not_where_its_name_says(tmp_path, monkeypatch,
                                                                     capsys):
    gpu = tmp_path / "mine.toml"
    text = (ROOT / "topologies" / "gpus" / "h100_sxm.toml").read_text()
    gpu.write_text(re.sub(r'(?m)^name = ".*"$', 'name = "../../escaped"', text, count=1))
    data = tmp_path / "d"
    data.mkdir()
    shutil.copy(ROOT / "simulator/calibration/data/h100_sxm/gemm.csv", data / "gemm.csv")
    monkeypatch.setattr(moe_fit, "fit", lambda g, d, source: g.calibration)  # the path only
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert calibrate.main("fit", str(gpu), str(data), None) == 0
    assert (work / "runs" / "calibration" / "mine.toml").is_file()
    assert not (tmp_path / "escaped.toml").exists()
    assert not list(tmp_path.glob("**/escaped.toml"))


def test_a_resumed_sweep_keeps_a_foreign_csv_byte_for_byte(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(tomli_w.dumps(TOY))
    (tmp_path / "g.toml").write_text('"engine.max_num_seqs" = [8]\n')
    out = tmp_path / "mine.csv"
    out.write_bytes(b"when,what\n2026-01-01,a finished row without a newline")
    before = out.read_bytes()
    assert main(["sweep", str(tmp_path / "s.toml"), "--grid", str(tmp_path / "g.toml"),
                 "--out", str(out), "--jobs", "1"]) == 2
    assert out.read_bytes() == before
    assert "header" in capsys.readouterr().err


def test_plan_refuses_its_out_folder_before_searching(tmp_path, monkeypatch, capsys):
    import simulator.planner as planner

    def never(*args, **kwargs):
        raise AssertionError("the search ran")

    monkeypatch.setattr(planner, "plan", never)
    (tmp_path / "s.toml").write_text(tomli_w.dumps(TOY))
    (tmp_path / "p").symlink_to(tmp_path)
    assert main(["plan", str(tmp_path / "s.toml"), "--out", str(tmp_path / "p")]) == 2
    assert "symbolic link" in capsys.readouterr().err


def test_every_cap_the_docs_quote_is_the_codes():
    text = (ROOT / "docs" / "scenario.md").read_text()
    caps = text[text.index("## Caps on files and commands"):text.index("## Outputs and")]
    expected = [
        f"{files.MAX_CONFIG_BYTES} bytes", f"{files.MAX_DATA_BYTES} bytes",
        f"no deeper than {files.MAX_DEPTH}", f"at most {files.EXCERPT}",
        f"`[0, {int(MAX_TIME_S * 1000)}]`", f"`[1, {MAX_TOKENS}]`",
        f"at most {MAX_REQUESTS} lines",
        f"`num_hidden_layers` in `[1, {FIELD_MAX['num_hidden_layers']}]`",
        f"counts in `[1, {FIELD_MAX['num_experts']}]`",
        f"`num_nextn_predict_layers` in `[0, {FIELD_MAX['num_nextn_predict_layers']}]`",
        f"integer field in `[1, {FIELD_DEFAULT_MAX}]`", f"at most {MAX_EXPERTS} numbers",
        f"at most {MAX_REQUESTS} requests", f"at most {MAX_TOKENS} tokens",
        f"at most {MAX_HASHES} block hashes", f"at most {MAX_RUNS} runs",
        f"`--jobs` in `[1, {arguments.MAX_JOBS}]`", f"`--gpus` in `[1, {arguments.MAX_GPUS}]`",
        f"`--top` in `[1, {arguments.MAX_TOP}]`", f"`--requests` in `[1, {MAX_REQUESTS}]`",
        f"`--nodes` in `[1, {arguments.MAX_NODES}]`",
        f"`--oversubscription` in `[1, {arguments.MAX_OVERSUBSCRIPTION:g}]`",
        f"`--concurrent` in `[1, {arguments.MAX_CONCURRENT}]`",
        f"`--oversubscription` in `(0, {arguments.MAX_OVERSUBSCRIPTION:g}]`",
        f"({int(MAX_BYTES)} bytes)",
    ]
    missing = [e for e in expected if e not in caps]
    assert not missing, missing


def test_a_fractional_gpu_count_is_refused(tmp_path):
    import pytest  # noqa: PLC0415

    from simulator.errors import ScenarioError as Error  # noqa: PLC0415
    from simulator.hardware.specs import load_node  # noqa: PLC0415

    text = (Path(__file__).resolve().parent.parent / "topologies" / "dgx-h100.toml").read_text()
    node = tmp_path / "n.toml"
    node.write_text(text.replace("gpus_per_node = 8", "gpus_per_node = 8.5"))
    with pytest.raises(Error, match="gpus_per_node = '8.5' is not a whole number"):
        load_node(str(node))
