"""Read a serving benchmark's result file: what was offered and what was measured.

``compare --measured FILE`` reads the result files that the common clients write:

- ``vllm bench serve --save-result``: one JSON object (``*_ttft_ms``, ``*_e2el_ms`` keys);
- ``python -m sglang.bench_serving``: JSON Lines, one run a line (``*_ttft_ms``,
  ``*_e2e_latency_ms`` keys);
- genai-perf and AIPerf: ``profile_export_*.json`` (metric tables ``{"unit", "avg",
  "p50", ...}``) and their CSV exports;
- ``trtllm-bench throughput --report_json``: one JSON object (``performance`` and
  ``request_info`` sections).

Each becomes a :class:`Measured`: the load (requests, concurrency or rate, prompt and
output lengths) and the metrics in one vocabulary, seconds: ``ttft``, ``tpot``, ``itl``,
``e2e`` with ``mean``, ``p50``, ``p90``, ``p95``, ``p99`` (``ttft_p99_s``), and
``throughput_req_per_s`` and ``throughput_tok_per_s`` (output tokens). Where the tools'
definitions differ (genai-perf's and AIPerf's ``inter_token_latency`` is a per-request
mean gap, vLLM's TPOT; vLLM's ITL pools every gap) the reader maps each to the simulator's
metric of the same definition (docs/metrics.md). Field names are read from the tools'
source: vLLM ``vllm/benchmarks/serve.py``, SGLang ``python/sglang/bench_serving.py``,
AIPerf ``docs/tutorials/working-with-profile-exports.md``, TensorRT-LLM
``tensorrt_llm/bench/dataclasses/reporting.py``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simulator import files
from simulator.errors import ScenarioError

#: A result file is a few MB even with per-request details; refuse what cannot be one.
MAX_BYTES = 256 * 2**20
STATS = ("mean", "p50", "p90", "p95", "p99")
METRICS = ("ttft", "tpot", "itl", "e2e")
TOOLS = ("vllm-bench", "sglang-bench", "genai-perf", "aiperf", "trtllm-bench")
_MS_KEY = re.compile(r"^(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el|e2e_latency)_ms$")
_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e", "e2e_latency": "e2e"}


@dataclass(frozen=True)
class Lengths:
    """Token lengths of the measured requests: per request when the file has them."""

    mean: float
    std: float = 0.0
    low: int | None = None
    high: int | None = None

    @classmethod
    def of(cls, values) -> Lengths:
        x = np.asarray(values, dtype=float)
        return cls(float(x.mean()), float(x.std()), int(x.min()), int(x.max()))


@dataclass(frozen=True)
class Measured:
    """One benchmark run: its load and its metrics (seconds, requests/s, tokens/s)."""

    tool: str
    path: str
    requests: int
    prompt: Lengths
    output: Lengths
    concurrency: int | None = None  # None: not capped
    rate_per_s: float | None = None  # None: infinite (all at once, or the cap's pace)
    burstiness: float = 1.0  # vLLM's gamma shape (1: Poisson)
    metrics: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def _fail(path: Path, what: str) -> ScenarioError:
    return ScenarioError(f"--measured {files.excerpt(str(path), 80)}: {what}")


def _number(path: Path, key: str, value, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < 0 or (positive and value <= 0):
        raise _fail(path, f"{key} is not a {'positive' if positive else 'non-negative'} "
                          f"number ({str(value)[:16]!r})")
    return float(value)


def _read_text(path: Path) -> str:
    """Through the input layer: a regular file of at most :data:`MAX_BYTES`, UTF-8."""
    return files.read_text(path, "--measured", MAX_BYTES)


def _json(path: Path, text: str, line: int | None):
    try:
        data = json.loads(text)
    except RecursionError:
        raise _fail(path, "nested too deeply to be a benchmark result") from None
    except json.JSONDecodeError:
        pass
    else:
        files.check_depth(data, f"--measured {files.excerpt(str(path), 80)}")
        return data
    rows = [r for r in text.splitlines() if r.strip()]
    try:
        runs = [json.loads(r) for r in rows]
    except (json.JSONDecodeError, RecursionError):
        return None
    if not runs:
        return None
    if line is None and len(runs) > 1:
        raise _fail(path, f"holds {len(runs)} runs (one a line); pick one with --line N "
                          f"(1-{len(runs)})")
    k = (line or 1) - 1
    if not 0 <= k < len(runs):
        raise _fail(path, f"--line {line} is not a run of this file (1-{len(runs)})")
    return runs[k]


def read_measured(path: str | Path, line: int | None = None) -> Measured:
    """The benchmark run in ``path`` (see the module docstring for the formats)."""
    path = Path(path)
    text = _read_text(path)
    data = _json(path, text, line)
    if data is None:
        if path.suffix.lower() == ".csv":
            return _perf_csv(path, text)
        raise _fail(path, "neither JSON, JSON Lines nor a genai-perf/AIPerf CSV export")
    if not isinstance(data, dict):
        raise _fail(path, "the result is not a JSON object")
    if "performance" in data and "request_info" in data:
        return _trtllm(path, data)
    if isinstance(data.get("time_to_first_token"), dict) or isinstance(
            data.get("request_latency"), dict):
        return _perf_json(path, data)
    keys = [m for k in data if (m := _MS_KEY.match(str(k)))]
    if keys:
        sglang = any(m.group(2) == "e2e_latency" for m in keys)
        return _bench_serve(path, data, "sglang-bench" if sglang else "vllm-bench")
    raise _fail(path, "no benchmark metrics found (allowed formats: "
                      f"{', '.join(TOOLS)})")


def _bench_serve(path: Path, data: dict, tool: str) -> Measured:
    """``vllm bench serve`` and ``sglang.bench_serving``: milliseconds, one key a figure."""
    metrics: dict[str, float] = {}
    for k, v in data.items():
        m = _MS_KEY.match(str(k))
        if m is None or v is None:
            continue
        stat = {"median": "p50"}.get(m.group(1), m.group(1))
        if stat in STATS:
            metrics[f"{_NAMES[m.group(2)]}_{stat}_s"] = _number(path, k, v) / 1e3
    for key, ours in (("request_throughput", "throughput_req_per_s"),
                      ("output_throughput", "throughput_tok_per_s")):
        if data.get(key) is not None:
            metrics[ours] = _number(path, key, data[key])
    completed = int(_number(path, "completed", data.get("completed"), positive=True))
    requests = completed + int(_number(path, "failed", data.get("failed") or 0))
    prompt, output = _lengths(path, data, completed)
    rate = data.get("request_rate", "inf")
    rate_per_s = None if rate in ("inf", None) or rate == float("inf") else \
        _number(path, "request_rate", rate, positive=True)
    conc = data.get("max_concurrency")
    return Measured(tool, str(path), requests, prompt, output,
                    None if conc is None else int(_number(path, "max_concurrency", conc,
                                                          positive=True)),
                    rate_per_s, _number(path, "burstiness", data.get("burstiness", 1.0),
                                        positive=True), metrics)


def _lengths(path: Path, data: dict, completed: int) -> tuple[Lengths, Lengths]:
    out = []
    for lens, total in (("input_lens", "total_input_tokens"),
                        ("output_lens", "total_output_tokens")):
        values = data.get(lens)
        if isinstance(values, list) and values:
            for v in values:
                _number(path, lens, v, positive=True)
            out.append(Lengths.of(values))
        else:
            out.append(Lengths(_number(path, total, data.get(total), positive=True)
                               / completed))
    return out[0], out[1]


#: genai-perf / AIPerf metric tables -> ours. Their inter_token_latency is the per-request
#: mean gap after the first token, (latency - TTFT) / (output tokens - 1): our TPOT.
_PERF = {"time_to_first_token": "ttft", "inter_token_latency": "tpot",
         "request_latency": "e2e"}
_PERF_STATS = {"avg": "mean", "p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99"}


def _perf_json(path: Path, data: dict) -> Measured:
    metrics = {}
    for name, ours in _PERF.items():
        table = data.get(name)
        if not isinstance(table, dict):
            continue
        scale = 1e-3 if table.get("unit", "ms") == "ms" else 1e-9 if table.get(
            "unit") == "ns" else 1.0
        for stat, s in _PERF_STATS.items():
            if table.get(stat) is not None:
                metrics[f"{ours}_{s}_s"] = _number(path, f"{name}.{stat}", table[stat]) * scale
    for name, ours in (("request_throughput", "throughput_req_per_s"),
                       ("output_token_throughput", "throughput_tok_per_s")):
        if isinstance(data.get(name), dict) and data[name].get("avg") is not None:
            metrics[ours] = _number(path, f"{name}.avg", data[name]["avg"])
    config = data.get("input_config") or {}
    loadgen = config.get("loadgen") or {}
    tool = "aiperf" if loadgen or "aiperf" in path.name else "genai-perf"
    count = (data.get("request_count") or {}).get("avg")
    if count is None:
        raise _fail(path, "request_count.avg is missing (the number of requests measured)")
    conc = loadgen.get("concurrency", config.get("concurrency"))
    rate = loadgen.get("request_rate", config.get("request_rate"))
    return Measured(tool, str(path), int(_number(path, "request_count.avg", count, True)),
                    _perf_lengths(path, data, "input_sequence_length"),
                    _perf_lengths(path, data, "output_sequence_length"),
                    None if conc is None else int(_number(path, "concurrency", conc, True)),
                    None if rate is None else _number(path, "request_rate", rate, True),
                    1.0, metrics)


def _perf_lengths(path: Path, data: dict, name: str) -> Lengths:
    table = data.get(name)
    if not isinstance(table, dict) or table.get("avg") is None:
        raise _fail(path, f"{name}.avg is missing (the measured token lengths)")
    low, high = table.get("min"), table.get("max")
    return Lengths(_number(path, f"{name}.avg", table["avg"], True),
                   _number(path, f"{name}.std", table.get("std") or 0.0),
                   None if low is None else int(_number(path, f"{name}.min", low)),
                   None if high is None else int(_number(path, f"{name}.max", high)))


_CSV_NAMES = {"time to first token": "time_to_first_token",
              "inter token latency": "inter_token_latency",
              "request latency": "request_latency",
              "input sequence length": "input_sequence_length",
              "output sequence length": "output_sequence_length",
              "request throughput": "request_throughput",
              "output token throughput": "output_token_throughput",
              "request count": "request_count"}


def _perf_csv(path: Path, text: str) -> Measured:
    """A genai-perf / AIPerf CSV export: a statistics section, then ``Metric,Value`` rows.
    It does not record the load: pass ``--concurrency`` or ``--rate`` to ``compare``."""
    data: dict = {}
    header: list[str] = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0].strip():
            header = []
            continue
        if row[0].strip() == "Metric":
            header = [h.strip() for h in row]
            continue
        name = _CSV_NAMES.get(re.sub(r"\s*\(.*\)\s*$", "", row[0]).strip().lower())
        if name is None or not header:
            continue
        unit = re.search(r"\(([^)]*)\)", row[0])
        table = {"unit": unit.group(1) if unit else ""}
        for h, v in zip(header[1:], row[1:], strict=False):
            try:
                table["avg" if h == "Value" else h] = float(v.replace(",", ""))
            except ValueError:
                raise _fail(path, f"{row[0][:40]!r} {h[:10]}: not a number "
                                  f"({v[:16]!r})") from None
        data[name] = table
    if not data:
        raise _fail(path, "no genai-perf/AIPerf metric rows found")
    return _perf_json(path, data)


def _trtllm(path: Path, data: dict) -> Measured:
    """``trtllm-bench throughput --report_json``: percentile tables in milliseconds."""
    perf, info = data["performance"] or {}, data["request_info"] or {}
    metrics = {}
    tables = {"e2e": perf.get("request_latency_percentiles_ms")}
    streaming = data.get("streaming_metrics") or {}
    tables |= {"ttft": streaming.get("ttft_percentiles"),
               "tpot": streaming.get("tpot_percentiles")}
    for ours, table in tables.items():
        for stat, s in (("average", "mean"), ("p50", "p50"), ("p90", "p90"),
                        ("p95", "p95"), ("p99", "p99")):
            if isinstance(table, dict) and table.get(stat) is not None:
                metrics[f"{ours}_{s}_s"] = _number(path, f"{ours}.{stat}", table[stat]) / 1e3
    for key, ours in (("request_throughput_req_s", "throughput_req_per_s"),
                      ("system_output_throughput_tok_s", "throughput_tok_per_s")):
        if perf.get(key) is not None:
            metrics[ours] = _number(path, f"performance.{key}", perf[key])
    n = int(_number(path, "request_info.num_requests", info.get("num_requests"), True))
    prompt = Lengths(_number(path, "request_info.avg_input_length",
                             info.get("avg_input_length"), True))
    output = Lengths(_number(path, "request_info.avg_output_length",
                             info.get("avg_output_length"), True))
    note = ("trtllm-bench's report does not record --concurrency: simulated as offline "
            "(every request at once) unless compare is given --concurrency")
    return Measured("trtllm-bench", str(path), n, prompt, output, None, None, 1.0, metrics,
                    (note,))
