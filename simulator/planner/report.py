"""Text and files of a plan or a capacity search: what the CLI prints and writes.

plan: ``plan.csv`` (simulated candidates, ranked), ``candidates.csv`` (every enumerated
candidate with its estimate or the reason it is out), ``pareto.png``, and
``recommended.toml``: the scenario with the pick's layout and engine limits, runnable by
``run`` and ``capacity`` as it is (relative paths made absolute). capacity:
``capacity.csv`` (one row per probe) and ``capacity.png``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import tomli_w
import yaml

from simulator.files import out_files
from simulator.io.scenario import load_scenario, to_dict
from simulator.io.schema import Scenario
from simulator.planner.capacity import TOO_SHORT, CapacityResult
from simulator.planner.disagg import pools_of
from simulator.planner.hetero import cross_pools
from simulator.planner.launch import ENGINES, dynamo, launch, llmd
from simulator.planner.mixdp import mix_kind, mix_pools
from simulator.planner.nearmiss import MARGIN_QUANTILE
from simulator.planner.objectives import side_by_side
from simulator.planner.plan import PlanResult
from simulator.planner.plots import capacity_plot, pareto_plot
from simulator.planner.space import Limits, cross_kind, layout_label

#: File name of the pick's runnable scenario in a plan's output folder.
RECOMMENDED = "recommended.toml"
#: File name of the pick's launch commands (vLLM, SGLang, TensorRT-LLM).
LAUNCH = "launch.sh"
#: A disaggregated pick's NVIDIA Dynamo deployment and llm-d Helm values.
DYNAMO, LLMD = "dynamo.yaml", "llm-d-values.yaml"


def _absolute(value, base: Path):
    """A path-like string that names an existing file under ``base``, made absolute (the
    scenario file moves to the plan's folder); anything else as it is."""
    if isinstance(value, dict):
        return {k: _absolute(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute(v, base) for v in value]
    if isinstance(value, str) and ("/" in value or "." in value) and not Path(value).is_absolute():
        candidate = base / value
        if candidate.exists():
            return str(candidate.resolve())
    return value


def recommended_scenario(result: PlanResult) -> dict | None:
    """The scenario with the pick's layout and engine limits (None without a pick)."""
    return None if result.best is None else row_scenario(result, result.best)


def row_scenario(result: PlanResult, best: pd.Series) -> dict:
    """The scenario with one plan.csv row's layout and engine limits, runnable as it is;
    it keeps the scenario's own request count."""
    s = result.scenario
    data = to_dict(s)
    lay = {k: int(best[k]) for k in ("tp", "pp", "dp")}
    lim = Limits.of_row(best)
    data["name"] = f"{s.name}-tp{lay['tp']}-pp{lay['pp']}-dp{lay['dp']}"
    if result.own_requests is None:  # the sample the plan simulated is not the scenario's
        data["workload"].pop("num_requests", None)
    else:
        data["workload"]["num_requests"] = result.own_requests
    data["parallel"] = {**data.get("parallel", {}), **lay}
    for key, value in lim.overrides().items():
        data["engine"][key.split(".", 1)[1]] = value
    k = best.get("spec_k")
    if "speculative" in data and k is not None and k == k:  # the searched k, or none
        if int(k) > 0:
            data["speculative"]["num_speculative_tokens"] = int(k)
        else:
            del data["speculative"]
    if best.get("kind") == "disaggregated":
        data["name"] = f"{s.name}-disagg"
        # cross-kind: pools on two node kinds (simulator.planner.hetero)
        data["pools"] = (cross_pools(best, s) if cross_kind(best)
                         else pools_of(best, s.cluster.nodes, s))
        data.pop("speculative", None)  # the decode pool's own (pools_of), if any
    if mix_kind(best):  # replicas on two node kinds (simulator.planner.mixdp)
        data["name"] = f"{s.name}-mixed-dp"
        data["pools"] = mix_pools(best, s)
    return _absolute(data, Path(s.base_dir))


def write_plan(result: PlanResult, out: str | Path, figure: bool = True) -> list[Path]:
    """Write plan.csv, candidates.csv and (unless ``figure`` is false) pareto.png."""
    pick = recommended_scenario(result)
    drawn = figure and not result.table.empty
    names = ["plan.csv", "candidates.csv", *[RECOMMENDED] * (pick is not None),
             *["pareto.png"] * drawn]
    targets = out_files(out, names, "--out")
    out = targets[0].parent
    files = targets[:2]
    result.table.to_csv(files[0], index=False)
    result.candidates.to_csv(files[1], index=False)
    if pick is not None:
        files.append(out / RECOMMENDED)
        files[-1].write_text(f"# The plan's pick for {result.scenario.name}: {result.reason}\n"
                             .replace("\n", " ").rstrip() + "\n" + tomli_w.dumps(pick))
    if pick is not None:
        files += write_launch(load_scenario(pick), out)
    if drawn:
        s = result.scenario
        where = (", ".join(sorted(result.table["node"].unique())) if "node" in result.table
                 else f"{s.cluster.nodes} x {s.cluster.topology}")
        title = (f"{s.model.name} ({s.model.weight_dtype}) on {where}: throughput per GPU "
                 f"and per dollar vs speed per user")
        files.append(pareto_plot(result.table, out / "pareto.png", title))
    return files


def write_launch(s: Scenario, out: str | Path) -> list[Path]:
    """Write ``launch.sh`` (the commands that start the scenario on vLLM, SGLang and
    TensorRT-LLM, :mod:`simulator.planner.launch`) and TensorRT-LLM's LLM API options
    files beside it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    found = launch(s)
    parts = [f"# Launch {s.name} ({found.model}): one command per replica; run each "
             f"replica's on its own GPUs, behind a router.", *(f"# note: {n}" for n in
                                                             found.notes)]
    names = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
    for engine in ENGINES:
        parts += ["", f"## {names[engine]}", found.text(engine)]
    files = [out / LAUNCH]
    files[0].write_text("\n".join(parts) + "\n")
    for argv, extra in zip(found.commands["trtllm"], found.extra, strict=True):
        files.append(out / argv[argv.index("--extra_llm_api_options") + 1])
        files[-1].write_text(yaml.safe_dump(extra, sort_keys=False))
    if sorted(v.role for v in found.servers) == ["decode", "prefill"]:  # Kubernetes
        files.append(out / DYNAMO)
        files[-1].write_text(yaml.safe_dump(dynamo(found, _k8s_name(s.name)), sort_keys=False))
        files.append(out / LLMD)
        files[-1].write_text(yaml.safe_dump(llmd(found), sort_keys=False))
    return files


def _k8s_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label: lowercase alphanumerics and '-')."""
    text = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return text[:63].rstrip("-") or "plan"


def format_plan(result: PlanResult) -> str:
    """The recommendation and the top of the ranking, as printed by ``plan``."""
    s, st = result.scenario, result.stats
    load = (f"{st.rate_per_s:.3g} req/s" if st.rate_per_s is not None
            else f"{st.concurrency} clients")
    n_feasible = int((result.candidates["status"] == "feasible").sum())
    where = (f"{s.cluster.nodes} x {s.cluster.topology} ({result.cluster_gpus} GPUs, "
             f"layouts up to {result.gpus})")
    if "node" in result.table:  # several node kinds (simulator/planner/kinds.py)
        where = (f"node kinds {', '.join(dict.fromkeys(result.candidates['node']))} "
                 f"(layouts up to {result.gpus} GPUs each)")
    lines = [f"plan {s.name}: {s.model.name} ({s.model.weight_dtype} weights, "
             f"{s.model.kv_dtype} KV) on {where}",
             f"  workload   {st.requests} requests simulated per candidate, {load}, prompt "
             f"mean {st.prompt_mean:.0f}, output mean {st.output_mean:.0f} tokens; SLO "
             f"p{result.quantile * 100:g} TTFT <= {s.slo.ttft_s:g} s, TPOT <= "
             f"{s.slo.tpot_s:g} s",
             f"  searched   {len(result.candidates)} candidates, {n_feasible} feasible, "
             f"{len(result.table)} simulated (objective {result.objective}) in "
             f"{result.wall_time_s:.1f} s"]
    rho = result.rank_correlation
    lines.append("  estimate   rank correlation with the simulation (Spearman, on the "
                 f"{int((result.table['status'] == 'ok').sum())} simulated points): "
                 + (f"{rho:.2f}" if rho == rho else "n/a (fewer than 3 distinct points)"))
    groups = result.rank_correlations or {}
    if len(groups) > 1:
        lines.append("             per kind: " + ", ".join(
            f"{g} {r:.2f}" if r == r else f"{g} n/a" for g, r in groups.items()))
    if result.margins:
        m = result.margins
        lines.append(f"  near miss  simulated when the estimate is within x{m['ttft']:.2f} of "
                     f"the TTFT target and x{m['tpot']:.2f} of the TPOT target (estimate / "
                     f"simulation, p{MARGIN_QUANTILE * 100:g} over the simulated points)")
    if result.best is not None:
        lines.append(f"  recommend  {result.reason}")
    for i, say in enumerate(result.noise or []):
        lines.append(f"  {'noise' if i == 0 else '':<10} {say}")
    both = side_by_side(result.table, result.objective)
    if both:
        lines.append(f"  agg/disagg {both}")
    short = int(result.table["keep_up_ratio"].isna().sum())
    if short:
        lines.append(f"  note       {short} of {len(result.table)} runs too short to judge keeping "
                     f"up (warm-up under their median E2E): judged on TTFT and TPOT alone; "
                     f"raise --requests")
    lines.append(f"  rule       {result.rule_why}")
    lines.append(f"             {result.comparison}")
    q = f"p{result.quantile * 100:g}"
    extra = {"goodput_per_usd": "goodput_req_per_usd",
             "tokens_per_joule": "tokens_per_joule"}.get(result.objective)
    w = max([14, *(len(layout_label(r)) for _, r in result.table.head(10).iterrows())])
    lines.append(f"  rank  {'layout':<{w + 2}}seqs budget GPUs  {'TTFT ' + q:>8}  "
                 f"{'TPOT ' + q:>8}  tok/s/GPU  goodput/GPU  SLO"
                 + (f"  {extra}" if extra else ""))
    for _, r in result.table.head(10).iterrows():
        budget = (int(r["max_num_batched_tokens"]) if pd.isna(r["chunk_size"])
                  else int(r["chunk_size"]))
        lay = layout_label(r)
        lines.append(f"  {int(r['rank']):>4}  {lay:<{w}} {int(r['max_num_seqs']):>5} "
                     f"{budget:>6} {int(r['gpus']):>4}  {r['ttft_slo_q_s']:>8.3f}  "
                     f"{r['tpot_slo_q_s']:>8.4f}  {r['throughput_tok_per_s_per_gpu']:>9.1f}  "
                     f"{r['goodput_req_per_s_per_gpu']:>11.3f}  "
                     f"{'met' if r['slo_met'] else 'missed'}"
                     + (f"  {r[extra]:.4g}" if extra else ""))
    return "\n".join(lines)


def write_capacity(result: CapacityResult, out: str | Path, figure: bool = True) -> list[Path]:
    """Write capacity.csv and (unless ``figure`` is false) capacity.png."""
    targets = out_files(out, ["capacity.csv", *["capacity.png"] * figure], "--out")
    out = targets[0].parent
    files = [out / "capacity.csv"]
    result.curve.to_csv(files[0], index=False)
    if figure:
        s = result.scenario
        p = s.parallel
        title = (f"{s.model.name} TP{p.tp} PP{p.pp} DP{p.dp} on {s.cluster.nodes} x "
                 f"{s.cluster.topology}: capacity {result.rate_per_s:.3g} req/s")
        files.append(capacity_plot(result.curve, out / "capacity.png", result.rate_per_s,
                                   s.slo.ttft_s, s.slo.tpot_s, result.quantile, title))
    return files


def format_capacity(result: CapacityResult) -> str:
    """What ``capacity`` prints."""
    s, p = result.scenario, result.scenario.parallel
    q = f"p{result.quantile * 100:g}"
    upper = (f"{result.failed_rate_per_s:.3g} req/s is not: {result.bound}"
             if result.failed_rate_per_s != float("inf") else result.bound)
    if TOO_SHORT in result.bound:  # a lower bound: the runs cannot judge above it
        upper = (f"a lower bound: at {result.failed_rate_per_s:.3g} req/s runs of "
                 f"{s.workload.num_requests} requests are {TOO_SHORT}")
    return "\n".join([
        f"capacity {s.name}: {s.model.name} TP{p.tp} PP{p.pp} DP{p.dp} on "
        f"{s.cluster.nodes} x {s.cluster.topology}, SLO {q} TTFT <= {s.slo.ttft_s:g} s, "
        f"TPOT <= {s.slo.tpot_s:g} s",
        f"  sustains   {result.rate_per_s:.3g} req/s (within {result.tolerance:.0%}); "
        f"{upper}",
        f"  probes     {len(result.curve)} simulations of {s.workload.num_requests} requests "
        f"in {result.wall_time_s:.1f} s"])
