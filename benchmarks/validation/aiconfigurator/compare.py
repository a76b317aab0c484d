"""Side-by-side benchmark: NVIDIA AIConfigurator's pick against this simulator's `plan`.

For each question (model, GPUs, ISL/OSL, TTFT/TPOT targets) it runs

1. AIConfigurator (``aiconfigurator cli default --serving-mode agg --backend vllm``) from
   its own virtualenv ``benchmarks/validation/aiconfigurator/.venv`` (made by
   ``setup_venv.sh``; it is not a dependency of the simulator). Without the venv the
   AIConfigurator columns come from ``aic_picks.csv``, the last recorded run, and the
   printout says so.
2. Our planner (:func:`simulator.planner.plan`) on the question's scenario file
   (``*.toml`` here: closed loop at the concurrency of AIConfigurator's pick, fixed ISL/OSL,
   the same SLOs judged at the median, the same GPUs), which proves its pick by simulation.
3. Our full simulation of AIConfigurator's pick on the same scenario, so both picks are
   compared on the same yardstick: the pick that meets the SLOs (median TTFT and TPOT) with
   the higher simulated output tokens/s per GPU is the one the simulation supports.

Usage::

    python benchmarks/validation/aiconfigurator/compare.py [--requests N] [--out FILE] [--refresh]

``--refresh`` reruns AIConfigurator even where ``aic_picks.csv`` has the question.
Prints a markdown table; ``--out`` also writes it (RESULTS.md is made that way).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from simulator.planner import plan  # noqa: E402
from simulator.planner.simulate import base_scenario, simulate  # noqa: E402
from simulator.sweep import resolve_point  # noqa: E402

VENV_AIC = HERE / ".venv" / "bin" / "aiconfigurator"
PICKS = HERE / "aic_picks.csv"
#: SLO quantile: AIConfigurator predicts steady-state (mean) TTFT and TPOT, so the
#: simulator judges the median, not its default p99.
QUANTILE = 0.5
PICK_COLUMNS = ["question", "rank", "parallel", "tp", "pp", "dp", "moe_tp", "moe_ep", "bs",
                "global_bs", "replicas", "gpus_per_replica", "concurrency", "tokens/s/gpu",
                "tokens/s/user", "ttft", "tpot", "backend", "version", "system"]


@dataclass(frozen=True)
class Question:
    """One question both tools answer: a scenario file and the matching AIConfigurator
    arguments (HF model id of its shipped config, system, GPUs, ISL/OSL, SLOs in ms)."""

    key: str
    toml: str
    hf_model: str
    system: str
    gpus: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    requests: int | None = None  # cap on simulated requests (the large MoE plans are slow)


QUESTIONS = [
    Question("llama70b-h200-8gpu", "llama70b-h200-8gpu.toml", "meta-llama/Meta-Llama-3.1-70B",
             "h200_sxm", 8, 1024, 256, 2000.0, 50.0),
    Question("llama70b-h100-8gpu", "llama70b-h100-8gpu.toml", "meta-llama/Meta-Llama-3.1-70B",
             "h100_sxm", 8, 1024, 256, 2000.0, 50.0),
    Question("qwen32b-h200-8gpu", "qwen32b-h200-8gpu.toml", "Qwen/Qwen3-32B",
             "h200_sxm", 8, 1024, 256, 1000.0, 30.0),
    Question("qwen235b-h200-8gpu", "qwen235b-h200-8gpu.toml", "Qwen/Qwen3-235B-A22B",
             "h200_sxm", 8, 1024, 256, 2000.0, 50.0),
    Question("dsv3-h200-16gpu", "dsv3-h200-16gpu.toml", "deepseek-ai/DeepSeek-V3",
             "h200_sxm", 16, 1024, 256, 2000.0, 50.0, requests=600),
]


def aic_command(q: Question, save_dir: str) -> list[str]:
    """The AIConfigurator command line of a question (aggregated serving, vLLM backend)."""
    return [str(VENV_AIC), "cli", "default", "--model-path", q.hf_model,
            "--total-gpus", str(q.gpus), "--system", q.system, "--backend", "vllm",
            "--serving-mode", "agg", "--isl", str(q.isl), "--osl", str(q.osl),
            "--ttft", f"{q.ttft_ms:g}", "--tpot", f"{q.tpot_ms:g}",
            "--save-dir", save_dir, "--no-color"]


def run_aic(q: Question) -> list[dict]:
    """Run AIConfigurator offline on a question; its top aggregated configurations, best
    first (``rank`` 1, 2, ...)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(aic_command(q, tmp), capture_output=True, text=True,
                              env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
                              timeout=600, check=False)
        found = sorted(Path(tmp).rglob("agg/best_config_topn.csv"))
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"aiconfigurator failed on {q.key}: {' | '.join(tail)}")
        top = pd.read_csv(found[0])
    rows = []
    for rank, (_, row) in enumerate(top.iterrows(), start=1):
        per_replica = int(row["num_total_gpus"])
        replicas = q.gpus // per_replica
        out = {k: row[k] for k in PICK_COLUMNS if k in row.index}
        out.update(question=q.key, rank=rank, replicas=replicas, gpus_per_replica=per_replica,
                   concurrency=int(row["concurrency"]) * replicas)
        rows.append(out)
    return rows


def aic_to_ours(pick: pd.Series, moe: bool) -> dict | None:
    """Our scenario overrides for AIConfigurator's layout, or None if we cannot express it.
    The closed loop runs at the pick's own concurrency (replicas x batch).

    Dense: tp x pp per replica, DP = replicas. MoE (AIC attention tp x dp, experts etp x ep
    over the same GPUs, docs/moe.md "Layouts"): tp = attention tp x dp GPUs per stage,
    ep = ep, attention DP when dp > 1 with attention_tp = AIC's tp; None when etp x ep is
    not that many GPUs."""
    tp, pp, dp = int(pick["tp"]), int(pick["pp"]), int(pick["dp"])
    point = {"parallel.pp": pp, "parallel.dp": int(pick["replicas"]),
             "engine.max_num_seqs": int(pick["global_bs"]),
             "workload.concurrency": int(pick["concurrency"])}  # its own operating point
    if not moe:
        return {"parallel.tp": tp, **point}
    etp, ep = int(pick["moe_tp"]), int(pick["moe_ep"])
    if etp * ep != tp * dp:
        return None
    out = {"parallel.tp": tp * dp, "parallel.ep": ep, "parallel.attention_dp": dp > 1}
    if dp > 1 and tp > 1:
        out["parallel.attention_tp"] = tp
    if ep == 1:
        out["parallel.redundant_experts"] = 0
    return {**out, **point}


def our_label(row) -> str:
    """``TP4 PP1 DP2 seqs 128`` (with ``EP`` and ``attn-DP`` for MoE)."""
    ep = int(row.get("ep", 1) or 1)
    moe = (f" EP{ep}" if ep > 1 else "") + (" attn-DP" if bool(row.get("attention_dp", False))
                                           else "")
    return (f"TP{int(row['tp'])} PP{int(row['pp'])} DP{int(row['dp'])}{moe}, "
            f"seqs {int(row['max_num_seqs'])}")


def aic_label(pick) -> str:
    return (f"{pick['parallel']} x {int(pick['replicas'])} replicas, bs {int(pick['global_bs'])}")


def _lead(a: float, b: float) -> tuple[str, float]:
    """("ours" or "AIC", % by which the larger of our a and AIC's b beats the other)."""
    gain = (max(a, b) / min(a, b) - 1.0) * 100.0 if min(a, b) > 0 else math.inf
    return ("ours" if a >= b else "AIC"), gain


def verdict(ours: dict, theirs: dict) -> str:
    """Which pick the simulation supports: median SLOs met first, then simulated output
    tokens/s per GPU (AIConfigurator's objective); goodput per GPU (requests/s per GPU
    that meet both SLOs, the planner's objective) is given beside it."""
    met_o, met_t = ours["slo_met"], theirs["slo_met"]
    if met_o != met_t:
        return f"simulation supports {'ours' if met_o else 'AIC'}: the other misses the SLOs"
    lead, gain = _lead(ours["throughput_tok_per_s_per_gpu"],
                       theirs["throughput_tok_per_s_per_gpu"])
    glead, ggain = _lead(ours["goodput_req_per_s_per_gpu"], theirs["goodput_req_per_s_per_gpu"])
    tail = "" if met_o else " (neither meets the SLOs)"
    return (f"simulation supports {lead} by {gain:.0f}% tok/s/GPU{tail}; "
            f"goodput/GPU: {glead} by {ggain:.0f}%")


def met(row: dict, q: Question) -> bool:
    return bool(row["ttft_q_s"] <= q.ttft_ms / 1e3 and row["tpot_q_s"] <= q.tpot_ms / 1e3)


def _same(ours: dict, point: dict) -> bool:
    """Whether our pick is AIC's layout (tp, pp, dp, ep, attention DP and max_num_seqs)."""
    for key, value in point.items():
        name = key.split(".")[1]
        if name in ("tp", "pp", "dp", "ep", "max_num_seqs", "attention_dp") and \
                int(ours.get(name, 1 if name == "ep" else 0)) != int(value):
            return False
    return True


def compare(q: Question, top: pd.DataFrame, requests: int, jobs: int) -> dict:
    """Our plan, our simulation of AIC's rank-1 pick (and of its best pick we can express,
    when rank 1 is a layout the simulator has no equivalent of), and the verdicts."""
    toml = HERE / q.toml
    t0 = time.perf_counter()
    res = plan(str(toml), top=8, requests=requests, jobs=jobs, slo_quantile=QUANTILE)
    best = res.best if res.best is not None else res.table.iloc[0]
    ours = dict(best)
    ours["ttft_q_s"], ours["tpot_q_s"] = best["ttft_slo_q_s"], best["tpot_slo_q_s"]
    ours["slo_met"] = met(ours, q)
    moe = "ep" in res.table.columns
    base = base_scenario(str(toml), requests=requests)
    entries = []
    for _, pick in top.iterrows():
        point = aic_to_ours(pick, moe)
        if point is None:
            if not entries:  # rank 1 inexpressible: report it, then go on to the next
                entries.append((pick, {"status": "error", "error":
                                       f"no equivalent of {pick['parallel']} here"}, ""))
            continue
        theirs = simulate(resolve_point(base, point, res.scenario.seed), QUANTILE)
        if theirs["status"] == "ok":
            theirs["slo_met"] = met(theirs, q)
        if theirs["status"] != "ok":
            text = f"our simulation refuses it: {theirs['error']}"
        else:
            text = "same layout" if _same(ours, point) else verdict(ours, theirs)
        entries.append((pick, theirs, text))
        break
    return {"ours": ours, "aic": entries, "plan_s": time.perf_counter() - t0,
            "clients": res.scenario.workload.concurrency,
            "note": "" if res.best is not None else "no simulated layout met the SLOs"}


def fmt(x, digits=0) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{x:.{digits}f}"


def _goodput(row: dict) -> str:
    return f"{row['goodput_req_per_s_per_gpu']:.3f} ({row['slo_attainment']:.2f})"


def render(rows: list[tuple[Question, dict]]) -> str:
    """The markdown table: each question, each tool's pick, predictions, simulations."""
    head = ("| question | tool | best configuration | predicted tok/s/GPU | predicted tok/s/user "
            "| our simulation: tok/s/GPU | tok/s/user | TTFT p50 (s) | TPOT p50 (ms) | SLOs "
            "| goodput req/s/GPU (attainment) | verdict |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for q, r in rows:
        o = r["ours"]
        ask = (f"{q.key}: ISL {q.isl} OSL {q.osl}, TTFT <= {q.ttft_ms / 1e3:g} s, "
               f"TPOT <= {q.tpot_ms:g} ms, {q.gpus} x {q.system.split('_')[0].upper()}")
        for i, (pick, t, verdict_text) in enumerate(r["aic"]):
            sim_t = (["-"] * 6 if t.get("status") != "ok" else
                     [fmt(t["throughput_tok_per_s_per_gpu"]), fmt(t["tok_per_s_per_user"], 1),
                      fmt(t["ttft_q_s"], 3), fmt(t["tpot_q_s"] * 1e3, 1),
                      "met" if t["slo_met"] else "missed", _goodput(t)])
            if t.get("status") != "ok" and not verdict_text:
                verdict_text = t["error"]
            lines.append(
                f"| {ask if i == 0 else ''} | AIConfigurator rank {int(pick['rank'])} "
                f"({int(pick['concurrency'])} clients, "
                f"vLLM {pick['version']} perf DB) | {aic_label(pick)} | "
                f"{fmt(float(pick['tokens/s/gpu']))} | {fmt(float(pick['tokens/s/user']), 1)} | "
                + " | ".join(sim_t) + f" | {verdict_text} |")
        lines.append(
            f"| | simulator plan ({r['clients']} clients, {o['gpus']:.0f} GPUs) | "
            f"{our_label(o)} | "
            f"{fmt(o['throughput_tok_per_s_per_gpu'])} (simulated) | "
            f"{fmt(o['tok_per_s_per_user'], 1)} | {fmt(o['throughput_tok_per_s_per_gpu'])} | "
            f"{fmt(o['tok_per_s_per_user'], 1)} | {fmt(o['ttft_q_s'], 3)} | "
            f"{fmt(o['tpot_q_s'] * 1e3, 1)} | {'met' if o['slo_met'] else 'missed'} | "
            f"{_goodput(o)} | {r['note']} |")
    return "\n".join(lines)


def load_picks(refresh: bool) -> dict[str, pd.DataFrame]:
    """AIConfigurator's top configurations per question (rank 1 first): run now when its
    venv exists, else the ones recorded in aic_picks.csv."""
    recorded = pd.read_csv(PICKS) if PICKS.exists() else pd.DataFrame(columns=PICK_COLUMNS)
    if not VENV_AIC.exists():
        print(f"AIConfigurator venv missing ({VENV_AIC}): run "
              "benchmarks/validation/aiconfigurator/setup_venv.sh to rerun it; using the "
              f"picks recorded in {PICKS.name}", file=sys.stderr)
    else:
        fresh = []
        for q in QUESTIONS:
            if refresh or q.key not in set(recorded["question"]):
                print(f"aiconfigurator: {q.key} ...", file=sys.stderr)
                try:
                    fresh.extend(run_aic(q))
                except RuntimeError as exc:
                    print(exc, file=sys.stderr)
        if fresh:
            new = pd.DataFrame(fresh, columns=PICK_COLUMNS)
            keep = recorded[~recorded["question"].isin(new["question"])]
            recorded = pd.concat([keep, new], ignore_index=True)
            recorded.to_csv(PICKS, index=False)
    return {k: g.sort_values("rank").reset_index(drop=True)
            for k, g in recorded.groupby("question", sort=False)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1500,
                    help="requests simulated per candidate (default 1500)")
    ap.add_argument("--jobs", type=int, default=2, help="simulation processes (default 2)")
    ap.add_argument("--refresh", action="store_true", help="rerun AIConfigurator")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    args = ap.parse_args(argv)
    picks = load_picks(args.refresh)
    rows = []
    for q in QUESTIONS:
        if q.key not in picks:
            print(f"{q.key}: no AIConfigurator answer, skipped", file=sys.stderr)
            continue
        r = compare(q, picks[q.key], min(args.requests, q.requests or args.requests),
                    args.jobs)
        print(f"{q.key}: plan + simulations in {r['plan_s']:.1f} s", file=sys.stderr)
        rows.append((q, r))
    table = render(rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
