"""Regenerate docs/policies.md: the serving policies' trade-offs, measured by simulation.

Every number in that page comes from the scenarios below (Llama-3.1-8B on DGX H100).
Run: python benchmarks/docs/policies.py [--out docs/policies.md]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import simulator


def real(workload: dict, **engine) -> dict:
    return {"name": "policy", "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "output": {"steps": False},
            "engine": {"max_model_len": 8192, **engine}, "workload": workload}


def table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(label for label, _, _ in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(fmt.format(r[key]) for _, key, fmt in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def schedulers_mixed(tmp: Path) -> str:
    rng = np.random.default_rng(0)
    n = 500
    prompt = np.where(rng.random(n) < 0.1, 6000, 200)
    pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / 6.0, n)), "prompt_tokens": prompt,
                  "output_tokens": 128}).to_csv(tmp / "mixed.csv", index=False)
    wl = {"arrival": "trace", "trace": str(tmp / "mixed.csv")}
    rows = []
    for name, args in [("vllm", {}), ("sarathi", {"chunk_size": 512}), ("vllm_v0", {}),
                       ("orca", {}), ("static", {})]:
        s = simulator.run(real(wl, scheduler=name, scheduler_args=args,
                                       **seqs(name))).summary
        rows.append({"scheduler": label(name, args), **s})
    return _ms(rows)


def seqs(name: str) -> dict:
    """Sarathi's token budget is ``max(chunk_size, max_num_seqs)`` (every decode must fit),
    so under the vLLM V1 profile's 1024 sequences a chunk below 1024 would not bind: its
    rows run with the 256 sequences of Sarathi-Serve's own setup."""
    return {"max_num_seqs": 256} if name == "sarathi" else {}


def label(name: str, args: dict) -> str:
    return name + "".join(f", {k}={v}" for k, v in args.items())


def _ms(rows: list[dict]) -> str:
    for r in rows:
        for k in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s"):
            r[k + "_ms"] = r[k] * 1e3
    return table(rows, [("scheduler", "scheduler", "`{}`"),
                        ("TTFT p50 (ms)", "ttft_p50_s_ms", "{:.0f}"),
                        ("TTFT p99 (ms)", "ttft_p99_s_ms", "{:.0f}"),
                        ("ITL p50 (ms)", "itl_p50_s_ms", "{:.1f}"),
                        ("ITL p99 (ms)", "itl_p99_s_ms", "{:.1f}"),
                        ("throughput (tok/s)", "throughput_tok_per_s", "{:.0f}")])


def light_ttft() -> str:
    wl = {"arrival": "poisson", "rate_per_s": 0.5, "num_requests": 60, "prompt_tokens": 4000,
          "output_tokens": 64}
    rows = []
    for name, args in [("vllm_v0", {}), ("vllm", {}), ("sarathi", {"chunk_size": 512})]:
        s = simulator.run(real(wl, scheduler=name, scheduler_args=args,
                                       **seqs(name))).summary
        rows.append({"scheduler": label(name, args), **s})
    return _ms(rows)


def routers() -> str:
    wl = {"arrival": "poisson", "rate_per_s": 30.0, "num_requests": 2000,
          "prompt_tokens": {"dist": "lognormal", "mean": 1500, "sigma": 1.2, "max": 30000},
          "output_tokens": {"dist": "lognormal", "mean": 300, "sigma": 1.2, "max": 8000}}
    rows = []
    for policy in ("round_robin", "random", "power_of_two", "least_outstanding", "least_kv",
                   "least_tokens"):
        sc = {**real(wl, max_model_len=40000), "parallel": {"dp": 4},
              "router": {"policy": policy}}
        s = simulator.run(sc).summary
        rows.append({"router": policy, "ttft_p50_ms": s["ttft_p50_s"] * 1e3,
                     "ttft_p99_ms": s["ttft_p99_s"] * 1e3, "e2e_p99_s": s["e2e_p99_s"]})
    return table(rows, [("router", "router", "`{}`"), ("TTFT p50 (ms)", "ttft_p50_ms", "{:.0f}"),
                        ("TTFT p99 (ms)", "ttft_p99_ms", "{:.0f}"),
                        ("E2E p99 (s)", "e2e_p99_s", "{:.1f}")])


def static_vs_continuous() -> str:
    wl = {"arrival": "poisson", "rate_per_s": 40.0, "num_requests": 1500,
          "prompt_tokens": {"dist": "uniform", "min": 100, "max": 2000},
          "output_tokens": {"dist": "uniform", "min": 10, "max": 1000}}
    rows = []
    for name in ("vllm", "orca", "static"):
        s = simulator.run(real(wl, scheduler=name, max_model_len=4096)).summary
        rows.append({"scheduler": name, **s, "ttft_p50_s": s["ttft_p50_s"]})
    return table(rows, [("scheduler", "scheduler", "`{}`"),
                        ("throughput (tok/s)", "throughput_tok_per_s", "{:.0f}"),
                        ("requests/s", "throughput_req_per_s", "{:.2f}"),
                        ("TTFT p50 (s)", "ttft_p50_s", "{:.1f}")])


def preemption(tmp: Path) -> str:
    from conftest import with_kv_tokens  # noqa: PLC0415 - the tests' helper, on sys.path

    node = (simulator.paths.TOPOLOGIES / "dgx-h100.toml").read_text()
    (tmp / "slow.toml").write_text(node.replace("bandwidth_Bps = 64e9", "bandwidth_Bps = 0.5e9"))
    rows = []
    for topo, label in [("dgx-h100", "PCIe Gen5, 64 GB/s"), (str(tmp / "slow.toml"), "0.5 GB/s")]:
        for prompt in (3000, 100):
            for mode in ("recompute", "swap"):
                wl = {"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 200,
                      "prompt_tokens": prompt,
                      "output_tokens": {"dist": "uniform", "min": 200, "max": 900}}
                sc = {**real(wl, preemption=mode, max_model_len=4096),
                      "cluster": {"topology": topo}}
                s = simulator.run(with_kv_tokens(sc, 30000)).summary
                rows.append({"link": label, "prompt": prompt, "mode": mode, **s})
    return table(rows, [("host link", "link", "{}"), ("prompt", "prompt", "{}"),
                        ("preemption", "mode", "`{}`"),
                        ("preemptions", "preemptions_total", "{}"),
                        ("E2E mean (s)", "e2e_mean_s", "{:.1f}"),
                        ("throughput (tok/s)", "throughput_tok_per_s", "{:.0f}")])


def bubbles(tmp: Path) -> str:
    rows = []
    for pp, m in [(2, 1), (4, 1), (2, 2), (4, 4), (4, 2)]:
        n = m
        pd.DataFrame({"arrival_s": [0.0] * n, "prompt_tokens": [2000] * n,
                      "output_tokens": [1] * n}).to_csv(tmp / "eq.csv", index=False)
        sc = {"name": "pp", "model": {"name": "llama-3.1-70b"},
              "cluster": {"topology": "dgx-h100", "nodes": 2}, "parallel": {"tp": 4, "pp": pp},
              "engine": {"max_inflight_microbatches": m, "step_overhead_s": 0.0},
              "workload": {"arrival": "trace", "trace": str(tmp / "eq.csv")}}
        s = simulator.run(sc).summary
        rows.append({"pp": pp, "m": m, "sim": s["pp_bubble_fraction"],
                     "closed": (pp - 1) / (m + pp - 1)})
    return table(rows, [("stages P", "pp", "{}"), ("micro-batches M", "m", "{}"),
                        ("simulated bubble", "sim", "{:.3f}"),
                        ("(P-1)/(M+P-1)", "closed", "{:.3f}")])


def chunked_pipeline(tmp: Path) -> str:
    rng = np.random.default_rng(1)
    n = 300
    prompt = np.where(rng.random(n) < 0.2, 8000, 300)
    pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / 4.0, n)), "prompt_tokens": prompt,
                  "output_tokens": 200}).to_csv(tmp / "pipe.csv", index=False)
    rows = []
    for name, args in [("vllm", {}), ("sarathi", {"chunk_size": 1024}),
                       ("sarathi", {"chunk_size": 256})]:
        sc = {"name": "pipe", "model": {"name": "llama-3.1-70b"},
              "cluster": {"topology": "dgx-h100", "nodes": 2}, "parallel": {"tp": 8, "pp": 2},
              "engine": {"scheduler": name, "scheduler_args": args, "max_model_len": 16384,
                         **seqs(name)},
              "workload": {"arrival": "trace", "trace": str(tmp / "pipe.csv")},
              "output": {"steps": False}}
        s = simulator.run(sc).summary
        rows.append({"scheduler": label(name, args), **s,
                     "itl_p99_ms": s["itl_p99_s"] * 1e3})
    return table(rows, [("scheduler", "scheduler", "`{}`"),
                        ("bubble fraction", "pp_bubble_fraction", "{:.3f}"),
                        ("ITL p99 (ms)", "itl_p99_ms", "{:.1f}"),
                        ("throughput (tok/s)", "throughput_tok_per_s", "{:.0f}")])


PAGE = """# Serving policies and their trade-offs

Generated by `python benchmarks/docs/policies.py` (Llama-3.1-8B on one DGX H100 unless said,
the default engine profile `vllm-v1` for every key a row does not set; every number below is
a simulation result, not a hand-entered value).

## Replica schedulers (`[engine] scheduler`, `scheduler_args`)

| scheduler | behaviour | parameters |
|---|---|---|
| `vllm` (default) | vLLM v1: every running decode gets a token, in-progress prefills continue, then waiting requests are admitted with chunked prefill, within `max_num_batched_tokens` and `max_num_seqs`; paged KV, blocks on demand | - |
| `vllm_v0` | vLLM v0: a step is all prefill (whole prompts, no chunking) or all decode; prefills first, so decodes stall while prompts run; swapped requests come back before new prompts | - |
| `sglang` | SGLang's default: while a prompt waits or is part-way through, a step is prefill only (never mixed with decodes), up to `max_num_batched_tokens` (SGLang's `chunked_prefill_size`), chunking the prompt that does not fit; decodes run when no prefill work is left | - |
| `sarathi` | Sarathi-Serve stall-free batching: decodes first, prefill chunks fill a fixed token budget per step, `max(chunk_size, max_num_seqs)` so that every decode fits (the rows below set `max_num_seqs = 256`, since the profile's 1024 would raise any smaller chunk to 1024) | `chunk_size` (512) |
| `orca` | iteration-level batching with KV reserved at admission for the longest sequence (no paging, no preemption); prompts run whole | `reserve_tokens` (default `max_model_len`; never less than the request's prompt + output) |
| `static` | request-level batching (FasterTransformer): a batch of up to `max_num_seqs` requests is prefilled together and decoded until all finish; then the next batch | `reserve_tokens` |

Preemption when KV blocks run out (`[engine] preemption`): `recompute` drops the KV and
re-prefills prompt + generated tokens later; `swap` copies a decoder's blocks over the GPU's
host link (the graph's PCIe path) into CPU memory (`swap_space_gib` per GPU; beyond it,
recompute) and back when blocks free up; the copies delay the step they happen in.
`preemptions` counts both per request.

### Mixed long and short prompts (10% of 6,000 tokens, 90% of 200; 128 output tokens; 6 req/s)

{mixed}

A long prompt run whole (`vllm_v0`) stalls every decode for its step, and every short
prefill adds a prefill-only step between decode steps: the p99 inter-token latency grows.
Chunked prefill keeps decodes in every step. `sarathi`'s 512-token chunks bound the longest
step, but a 6,000-token prompt now touches 12 steps instead of one, so more tokens wait
behind a prefill chunk: its p99 inter-token latency is above `vllm`'s (whose 8,192-token
budget takes such a prompt in one step), and long prompts wait longer for their first token.

### Light load, long prompts (4,000 tokens, 0.5 req/s)

{light}

At light load nothing competes with a new prompt: running it whole (`vllm_v0`) gives the
lowest TTFT, and 512-token chunks need 8 steps instead of 1.

### Request-level vs iteration-level batching (same memory, 40 req/s)

{static}

Static batching waits for the slowest request of a batch before admitting anyone; Orca
admits every iteration but reserves memory for the longest possible sequence, so fewer
requests run at once than with paged KV.

### Preemption: swap vs recompute (KV cache of 30,000 tokens, 20 req/s)

{preempt}

Swapping moves each block over the host link twice; recomputing re-runs the prompt and the
tokens generated so far. On PCIe Gen5 swapping a 3,000-token KV takes ~25 ms against a
re-prefill of ~200 ms; over a 0.5 GB/s link the same copy takes seconds and recompute wins.

## Routers (`[router] policy`)

`round_robin`, `random`, `power_of_two` (sample two, take the one with fewer in flight),
`least_outstanding` (fewest requests in flight), `least_kv` (lowest KV occupancy),
`least_tokens` (fewest prompt tokens waiting plus KV tokens held). Each decides from a
read-only view of the replicas and is tested without SimPy.

### Skewed request sizes (lognormal prompts and outputs, sigma 1.2; 4 replicas; 30 req/s)

{routers}

Blind policies send a burst of long requests to the same replica; load-aware ones see the
queue. `least_tokens` weighs requests by their size, which is what skew punishes.

## Pipeline micro-batching (`[engine] max_inflight_microbatches`, default `pp`)

M equal micro-batches (2,000-token prompts, one output token) through P stages of
Llama-3.1-70B (TP4 per stage, no CPU overhead): the bubble comes out of the events and
follows GPipe's (P-1)/(M+P-1); the small excess is the stage hand-off over NVLink.

{bubbles}

Serving micro-batches are not equal: a stream whose batch holds a long prefill keeps its
stage busy while the other stream's decode batch waits. Chunking makes the micro-batches
alike. Llama-3.1-70B, TP8 x PP2 over two DGX H100, 2 streams, 20% of prompts 8,000 tokens:

{chunked}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "docs" / "policies.md"))
    args = ap.parse_args()
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        page = PAGE.format(mixed=schedulers_mixed(tmp), light=light_ttft(),
                           static=static_vs_continuous(), preempt=preemption(tmp),
                           routers=routers(), bubbles=bubbles(tmp),
                           chunked=chunked_pipeline(tmp))
    Path(args.out).write_text(page)
    print(page)


if __name__ == "__main__":
    main()
