"""The hostile-input corpus: one row per case, for every command and every reader.

Each row names a command line, the files it finds in a fresh folder, the exit status it
must give and words its one line on stderr must hold. Files are written from the row: a
``str`` or ``bytes`` as it is, a ``dict`` as TOML (``.toml``) or JSON (anything else), a
:class:`Link` as a symbolic link. ``{d}`` in the command is the folder. Every row must
also leave no traceback, print one line to stderr, and leave every file it was given
unchanged (nothing read is modified, nothing is written through a link). New features add
rows here.
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomli_w
from conftest import DATA, toy_scenario

from simulator.cli import main


@dataclass(frozen=True)
class Link:
    """A symbolic link to ``target`` (``{d}`` is the folder)."""

    target: str


@dataclass(frozen=True)
class Case:
    id: str
    argv: str
    files: dict = field(default_factory=dict)
    words: tuple[str, ...] = ()
    rc: int = 2
    absent: tuple[str, ...] = ()  # words the message must not hold (a leaked value)


TOY = toy_scenario(workload={"arrival": "constant", "rate_per_s": 10.0, "num_requests": 4,
                             "prompt_tokens": 100, "output_tokens": 3})
MOE = json.loads((Path(__file__).parents[1] / "simulator/model/configs/qwen3-30b-a3b.json"
                  ).read_text())
SECRET = "s3cr3t-VALUE-that-must-never-show-up-anywhere-0123456789"


def sc(**sections) -> dict:
    """The toy scenario with ``sections`` merged in (a None value drops the key)."""
    data = copy.deepcopy(TOY)
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(data.get(name), dict):
            data[name] = {k: v for k, v in {**data[name], **values}.items() if v is not None}
        else:
            data[name] = values
    return data


def moe(**fields) -> dict:
    return {**MOE, **fields}


def mooncake(*rows: dict) -> str:
    good = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}
    return "".join(json.dumps({**good, **r}) + "\n" for r in rows)


def on_moe(config: str = "m.json", **extra) -> dict:
    return sc(model={"name": config}, **extra)


MOONCAKE_WL = {"arrival": "trace", "trace": "t.jsonl", "rate_per_s": None,
               "num_requests": None, "prompt_tokens": None, "output_tokens": None}
CSV_WL = {**MOONCAKE_WL, "trace": "t.csv"}

CASES = [
    # -- the scenario file ------------------------------------------------------------------
    Case("scenario-deep-toml", "validate {d}/s.toml",
         {"s.toml": "a = " + "[" * 5000 + "]" * 5000 + "\n"}, ("s.toml", "deeper than 32")),
    Case("scenario-deep-tables", "validate {d}/s.toml",
         {"s.toml": "[" + ".".join(["a"] * 40) + "]\nx = 1\n"}, ("s.toml", "deeper than 32")),
    Case("scenario-dev-zero", "validate {d}/s.toml", {"s.toml": Link("/dev/zero")},
         ("s.toml", "not a regular file")),
    Case("scenario-huge", "validate {d}/s.toml", {"s.toml": "#" * (17 * 2**20)},
         ("s.toml", "bytes, above")),
    # -- model config.json ------------------------------------------------------------------
    Case("config-deep-json", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": "[" * 100000 + "]" * 100000},
         ("model.name", "m.json", "deeper than 32")),
    Case("config-dev-zero", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": Link("/dev/zero")}, ("model.name", "not a regular")),
    Case("config-experts-1e308", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(num_experts=1e308)},
         ("num_experts", "[1, 4096]")),
    Case("config-layers-1e9", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(num_hidden_layers=10**9)},
         ("num_hidden_layers", "[1, 1024]")),
    Case("config-experts-zero", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(num_experts=0)}, ("num_experts", "0")),
    Case("config-long-string", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(hidden_size=SECRET)}, ("hidden_size",),
         absent=(SECRET[20:],)),
    Case("config-quant-string", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(quantization_config={"quant_method": SECRET})},
         ("quant_method",), absent=(SECRET[20:],)),
    # -- node and GPU files -----------------------------------------------------------------
    Case("node-dev-zero", "validate {d}/s.toml",
         {"s.toml": sc(cluster={"topology": "n.toml"}), "n.toml": Link("/dev/zero")},
         ("cluster.topology", "not a regular file")),
    Case("node-deep", "validate {d}/s.toml",
         {"s.toml": sc(cluster={"topology": "n.toml"}),
          "n.toml": "a = " + "[" * 40 + "]" * 40}, ("cluster.topology", "deeper than 32")),
    Case("gpu-long-string", "validate {d}/s.toml",
         {"s.toml": sc(cluster={"topology": "n.toml"}),
          "n.toml": (DATA / "toy_node.toml").read_text().replace(
              'gpu = "toy_gpu.toml"', 'gpu = "g.toml"'),
          "g.toml": (DATA / "toy_gpu.toml").read_text().replace(
              "memory_bytes =", f'memory_bytes = "{SECRET}"\nx_memory_bytes =')},
         ("memory_bytes",), absent=(SECRET[20:],)),
    # -- routing weights file ---------------------------------------------------------------
    # -- Mooncake traces --------------------------------------------------------------------
    Case("mooncake-binary", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": b"\x89PNG\r\n\x1a\n\xff\xfe\x00"},
         ("t.jsonl", "line 1", "UTF-8")),
    Case("mooncake-scalar-hashes", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": mooncake({"hash_ids": 7})},
         ("line 1", "hash_ids")),
    Case("mooncake-nested-hashes", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": mooncake({"hash_ids": [[1], [2]]})},
         ("line 1", "hash_ids")),
    Case("mooncake-deep", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": "[" * 100000 + "]" * 100000},
         ("line 1", "deeper than 32")),
    *[Case(f"mooncake-{col}-{label}", "validate {d}/s.toml",
           {"s.toml": sc(workload=MOONCAKE_WL),
            "t.jsonl": mooncake({}, {col: v, "hash_ids": [1, 2]})},
           ("t.jsonl", "line 2", col, "[1, 16777216]"))
      for col in ("input_length", "output_length")
      for label, v in (("negative", -5), ("zero", 0), ("fraction", 600.5), ("bool", True),
                       ("huge", 2**24 + 1), ("overflow", 10**30), ("string", SECRET))],
    *[Case(f"mooncake-timestamp-{label}", "validate {d}/s.toml",
           {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": mooncake({}, {"timestamp": v})},
           ("t.jsonl", "line 2", "timestamp"))
      for label, v in (("nan", math.nan), ("inf", math.inf), ("1e300", 1e300),
                       ("negative", -1), ("string", "soon"), ("bool", False))],
    # -- CSV traces -------------------------------------------------------------------------
    *[Case(f"csv-timestamp-{label}", "validate {d}/s.toml",
           {"s.toml": sc(workload=CSV_WL),
            "t.csv": f"arrival_s,prompt_tokens,output_tokens\n0,100,10\n{v},100,10\n"},
           ("t.csv", "row 3", "arrival_s"))
      for label, v in (("nan", "NaN"), ("inf", "Infinity"), ("1e300", "1e300"))],
    Case("csv-dev-zero", "validate {d}/s.toml",
         {"s.toml": sc(workload=CSV_WL), "t.csv": Link("/dev/zero")},
         ("t.csv", "not a regular file")),
]


def _write(folder: Path, files: dict) -> dict[Path, bytes | None]:
    kept = {}
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            path.symlink_to(content.target.format(d=folder))
            kept[path] = None
            continue
        if isinstance(content, dict):
            content = (tomli_w.dumps(content) if name.endswith(".toml")
                       else json.dumps(content))
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        kept[path] = path.read_bytes()
    return kept


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, monkeypatch, capsys):
    kept = _write(tmp_path, case.files)
    monkeypatch.chdir(tmp_path)
    argv = [a.format(d=tmp_path) for a in case.argv.split()]
    assert main(argv) == case.rc
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    if case.rc == 2:
        assert len(lines) == 1, err
    for word in case.words:
        assert word in err, (word, err)
    for word in case.absent:
        assert word not in err, (word, err)
    for path, before in kept.items():  # nothing read was changed or written through
        if before is None:
            assert path.is_symlink()
        else:
            assert path.read_bytes() == before, path
