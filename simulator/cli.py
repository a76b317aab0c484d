"""Command line: ``python -m simulator run|validate``. Parses, calls the library, writes files."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd

from simulator import arguments
from simulator.calibration.engines import describe as describe_kernels
from simulator.cluster.build import cluster_node, expert_setup
from simulator.cluster.pools import build_plan, describe_pools
from simulator.cluster.running import check, run
from simulator.default_scenario import DEFAULT_SCENARIO
from simulator.errors import NoAnswer, ScenarioError
from simulator.files import excerpt, out_file, out_files, out_folder, read_text
from simulator.hardware.specs import transfer_note
from simulator.io import runfolder
from simulator.io.scenario import load_scenario
from simulator.io.writers import check_out, default_out, size_notes, write_result
from simulator.model.memory import GIB, split_layers, weight_classes
from simulator.printout import format_summary, verdict
from simulator.sweep import BACKENDS, SweepInterrupted, sweep

#: Exit status of plan and capacity when the question has no answer (bad input: 2).
EXIT_NO_ANSWER = 3
#: Exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


def _load(args) -> object:
    source = args.scenario if args.scenario else dict(DEFAULT_SCENARIO)
    return load_scenario(source, overrides=args.set, seed=getattr(args, "seed", None),
                         unsets=args.unset)


def cmd_run(args) -> int:
    scenario = _load(args)
    keep = scenario.output.steps and not args.no_steps
    # The folder is checked before simulating: a run whose files cannot be written is lost.
    out = Path(args.out) if args.out else default_out(scenario.name, args.set, args.seed)
    replaces = check_out(out)
    result = run(scenario, progress=not args.quiet and sys.stderr.isatty(), keep_steps=keep,
                 interruptible=True)
    traced = scenario.output.trace and not args.no_trace
    notes = size_notes(result, keep, traced)
    for note in notes:
        if note.startswith("warning"):
            print(note, file=sys.stderr)
    try:
        write_result(result, out, steps=keep, trace=traced)
    except OSError as exc:
        raise ScenarioError(f"--out {str(out)!r}: cannot write ({exc.strerror})") from None
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    line = verdict(result.summary, result.requests, scenario.workload.arrival == "closed_loop",
                   scenario.slo.ttft_s, scenario.slo.tpot_s)
    print(format_summary(scenario.name, result.summary, result.requests, result.alerts, line))
    print(f"  kernels    {describe_kernels(cluster_node(scenario).gpu, scenario.engine.profile)}")
    for note in notes:
        if not note.startswith("warning"):
            print(f"  {note}")
    print(f"  outputs in {out}/" + (" (replaced the previous run's files)" if replaces else ""))
    if result.interrupted_s is not None:
        print(f"run interrupted (Ctrl-C) at {result.interrupted_s:.1f} s of simulated time: "
              f"the outputs cover the {len(result.requests)} requests recorded by then",
              file=sys.stderr)
        return 130
    return 0


def cmd_validate(args) -> int:
    scenario = _load(args)
    plan, requests = check(scenario)
    if requests is not None and requests.empty:
        raise ScenarioError("workload: no request arrives (check num_requests, duration_s, "
                            "start_s against the trace)", source=scenario.source)
    p, m = scenario.parallel, plan.model
    print(f"{scenario.source or 'default scenario'}: valid")
    if scenario.pools:  # docs/disaggregation.md
        print(describe_pools(plan))
        return 0
    print(f"  model      {m.name}: {m.describe()}, {scenario.model.weight_dtype} weights")
    gpus = f"{plan.gpus_used} GPU{'s' if plan.gpus_used != 1 else ''}"
    print(f"  cluster    {scenario.cluster.nodes} x {plan.node.name} "
          f"({plan.graph.graph['gpu'].name}), {gpus} used")
    if transfer_note(plan.graph.graph["gpu"]):  # docs/hardware.md
        print(f"  kernels    {transfer_note(plan.graph.graph['gpu'])}")
    else:  # the engine's own fit, or one carried from another GPU's (docs/cost-model.md)
        print(f"  kernels    {describe_kernels(plan.node.gpu, scenario.engine.profile)}")
    print(f"  layout     tp={p.tp} pp={p.pp} dp={p.dp}, "
          f"{plan.streams_per_replica} micro-batch stream(s) per replica")
    for rp in plan.replicas:
        stages = " | ".join(",".join(g.removeprefix("gpu") for g in st)
                            for st in rp.placement.stages)
        print(f"  replica {rp.placement.replica}  GPUs {stages}")
    st, tp0 = plan.replicas[0].stages[0], plan.replicas[0].placement.stages[0]
    if p.tp > 1 and p.attention_dp:  # docs/moe.md, "Layouts": no TP all-reduce
        a = p.attention_tp or 1
        who = "each GPU" if a == 1 else f"each group of {a} GPUs"
        how = ("exchange tokens by all-to-all" if p.ep == p.tp else
               f"all-gather every token over the {p.tp} GPUs and reduce-scatter the outputs")
        print(f"  tp all-reduce  none over the stage: attention DP ({who} runs attention for "
              f"its own requests; the MoE layers {how})")
    elif p.tp > 1:  # one all-reduce of a 64-token decode step, as the stage cost prices it
        nbytes, span = 64 * st.hidden_bytes, len({plan.graph.nodes[g]["node"] for g in tp0})
        print(f"  tp all-reduce  {span} node(s) per group: 64 tokens take "
              f"{st.allreduce.time(nbytes) * 1e6:.1f} us ({st.allreduce.algorithm(nbytes)})")
    mem = plan.memory
    print(f"  memory     weights {max(mem.weights_per_gpu) / GIB:.1f} GiB per GPU, KV cache "
          f"{mem.kv_blocks} blocks = {mem.kv_tokens} tokens per replica")
    if mem.note:
        print(f"  layout     {mem.note}")
    for line in memory_lines(scenario, plan):
        print(line)
    print(f"  max_model_len {plan.max_model_len}{_max_len_note(scenario, plan)}")
    w = scenario.workload
    if requests is None:
        print(f"  workload   closed loop, {w.concurrency} clients")
    else:
        print(f"  workload   {w.arrival}: {len(requests)} requests over "
              f"{requests['arrival_s'].max():.1f} s, prompt mean "
              f"{requests['prompt_tokens'].mean():.0f}, output mean "
              f"{requests['output_tokens'].mean():.0f} tokens")
    if plan.speculative is not None:  # docs/speculative.md
        sp = scenario.speculative
        print(f"  speculative {sp.method}, k = {sp.num_speculative_tokens}: "
              f"{1 + plan.speculative.acceptance.mean:.2f} tokens per verification step")
    return 0


def memory_lines(scenario, plan) -> list[str]:
    """The memory plan of a MoE / MLA / hybrid model by layer class (first stage, one
    GPU), the release's shipped precision, and the recurrent state set aside."""
    m, p, mem = plan.model, scenario.parallel, plan.memory
    lines = []
    if m.quant is not None:
        lines.append(f"  release    {m.quant.describe()}")
    if not m.layer_plan:
        return lines
    layout = expert_setup(scenario, m, plan.node)[0]
    stage = split_layers(m.layers, p.pp)[0]
    rows = weight_classes(m, p.tp, layout, stage, p.pp == 1, scenario.model.weight_dtype)
    lines.append("  weights    per GPU (stage 0): " + ", ".join(
        f"{name} {b / GIB:.2f} GiB ({dtype})" for name, b, dtype in rows))
    if m.linear is not None:
        kv_tp = 1 if p.attention_dp else p.tp
        per = m.linear.state_bytes_per_seq(kv_tp, stage - m.full_attention_layers(0, stage))
        seqs = round(mem.state_bytes_per_gpu / per) if per else 0
        lines.append(f"  state      Gated DeltaNet {per / 2**20:.1f} MiB per sequence per GPU "
                     f"x {seqs} sequences = {mem.state_bytes_per_gpu / GIB:.2f} GiB set "
                     f"aside; KV on {m.full_attention_layers()} of {m.layers} layers")
    return lines


def _max_len_note(scenario, plan) -> str:
    """Why max_model_len is below the model's context, when it is (requests longer than it
    are rejected)."""
    eng, limit = scenario.engine, plan.model.max_position_embeddings
    if eng.max_model_len is not None or plan.max_model_len >= limit:
        return ""
    why = ("max_num_batched_tokens: this scheduler runs each prompt whole"
           if plan.max_model_len == eng.max_num_batched_tokens else "the KV cache of a stream")
    return (f" (lowered from the model's {limit} to fit {why}; longer requests are "
            f"rejected)")


def cmd_sweep(args) -> int:
    base = load_scenario(args.scenario)
    out = Path(args.out) if args.out else Path("runs") / f"{base.name}-sweep.csv"
    try:
        df = sweep(args.scenario, args.grid, seeds=args.seeds, jobs=args.jobs,
                   backend=args.backend, out=out, ray_address=args.ray_address,
                   progress=not args.quiet and sys.stderr.isatty())
    except SweepInterrupted as stop:
        print(f"sweep interrupted: {stop.done} of {stop.total} runs kept in {out}; rerun the "
              f"same command to resume", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before the first run started
        print(f"sweep interrupted before any run finished; nothing new in {out}",
              file=sys.stderr)
        return 130
    ok = int((df["status"] == "ok").sum())
    ran = df.attrs.get("ran", len(df))
    done = (f"nothing ran: every run was already there (another --out, or remove {out}, "
            f"to run them again)" if ran == 0 else f"{ran} ran now" if ran < len(df) else "")
    print(f"sweep {base.name}: {len(df)} runs in {out} ({ok} ok, {len(df) - ok} failed)"
          + (f"; {done}" if done else ""))
    # Every distinct failure once, with how many runs it hit.
    for error, n in df.loc[df["status"] != "ok", "error"].value_counts(sort=False).items():
        print(f"  failed x{n}: {error}")
    if len(df) and ok == 0:
        print("sweep: every run failed", file=sys.stderr)
        return 1
    return 0


def cmd_plot(args) -> int:
    # Imported on use: matplotlib (and scipy below) would add ~2 s to every start.
    from simulator.plotting import STEP_FIGURES, run_report, save_sweep_plot  # noqa: PLC0415

    target = Path(args.target)
    if target.is_dir():
        if not any((target / f"requests.{x}").exists() for x in ("csv", "parquet")):
            raise ScenarioError(f"plot: {str(target)!r} has no requests.csv (not a run folder)")
        files = run_report(target, args.out)
        missing = [f"{stem}.png" for stem in STEP_FIGURES
                   if not any(f.stem == stem for f in files)]
        if missing:
            files.append(f"not drawn: {', '.join(missing)} (the run kept no per-step "
                         f"records; run it without --no-steps, or with output.energy = true "
                         f"for the heat map)")
    elif target.suffix == ".csv" and target.exists():
        df = runfolder.read_csv(target, "plot")
        missing = [k for k in (args.x, args.y, args.hue) if k and k not in df.columns]
        if not args.x or not args.y or missing:
            cols = ", ".join(c for c in df.columns if c not in ("run_id", "error"))
            raise ScenarioError(f"plot: a sweep CSV needs --x and --y among its columns"
                                f"{' (missing: ' + ', '.join(missing) + ')' if missing else ''}"
                                f"; columns: {cols}")
        if not pd.api.types.is_numeric_dtype(df[args.y]):
            raise ScenarioError(f"plot --y: column {excerpt(args.y)} of {str(target)!r} is not "
                                f"numeric (a metric of the sweep)")
        name = f"{target.stem}_{args.y}_vs_{args.x}.png".replace("/", "_")
        path = out_files(args.out or target.parent, [name], "plot --out")[0]
        files = [save_sweep_plot(df, args.x, args.y, args.hue, path)]
    else:
        raise ScenarioError(f"plot: {str(target)!r} is neither a run folder nor a sweep CSV")
    for f in files:
        print(f)
    return 0


def cmd_report(args) -> int:
    from simulator.report import html_report  # noqa: PLC0415 - matplotlib on use

    print(html_report(args.run))
    return 0


def cmd_compare(args) -> int:
    from simulator.report import compare_plot, compare_table, format_compare  # noqa: PLC0415

    if args.measured:
        return cmd_compare_measured(args)
    if args.day:
        return cmd_compare_day(args)
    if len(args.runs) < 2:
        raise ScenarioError("compare: give two or more run folders (or --measured FILE "
                            "SCENARIO)")
    table = compare_table(args.runs)
    out = Path(args.out) if args.out else Path("runs") / "compare"
    csv_path, png_path = out_files(out, ["compare.csv", "compare_cdf.png"], "compare --out")
    table.to_csv(csv_path, index=False)
    png = compare_plot(args.runs, png_path)
    print(format_compare(table))
    print(f"  outputs in {out}/ (compare.csv, {png.name})")
    return 0


def cmd_compare_day(args) -> int:
    """``compare --day RUN ...``: what each run of the same day cost and how well it served
    (docs/autoscaling.md, "Comparing days")."""
    from simulator.report import day_table, format_compare  # noqa: PLC0415

    table = day_table(args.runs)
    out = Path(args.out) if args.out else Path("runs") / "compare"
    (csv_path,) = out_files(out, ["compare_day.csv"], "compare --out")
    table.to_csv(csv_path, index=False)
    print(format_compare(table))
    print(f"  outputs in {out}/ (compare_day.csv)")
    return 0


def cmd_compare_measured(args) -> int:
    """``compare --measured FILE SCENARIO``: simulate the benchmark FILE measured, on the
    deployment SCENARIO describes, and put the two side by side."""
    from simulator.io.measured import read_measured  # noqa: PLC0415
    from simulator.io.scenario import read_toml  # noqa: PLC0415
    from simulator.metrics import measured as mm  # noqa: PLC0415
    from simulator.plotting import measured_vs_simulated  # noqa: PLC0415

    if len(args.runs) != 1:
        raise ScenarioError("compare --measured FILE: give one scenario TOML (the "
                            "deployment that was measured)")
    if args.concurrency is not None and args.concurrency < 1:
        raise ScenarioError(f"--concurrency: {args.concurrency} is not a positive integer")
    if args.rate is not None and not (0 < args.rate < float("inf")):
        raise ScenarioError(f"--rate: {args.rate!r} is not a positive finite rate (req/s)")
    measured = read_measured(args.measured, args.line)
    workload = mm.benchmark_workload(measured, args.concurrency, args.rate)
    source = Path(args.runs[0])
    data = read_toml(source) | {"workload": workload,
                                "_base_dir": str(source.resolve().parent),
                                "_source": str(source)}
    scenario = load_scenario(data, overrides=args.set, unsets=args.unset)
    out = Path(args.out) if args.out else Path("runs") / f"{scenario.name}-measured"
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ScenarioError(f"--out {str(out)[:80]!r}: not a folder (give a new or existing "
                            "folder; it receives measured_vs_simulated.csv and .png)")
    result = run(scenario, progress=sys.stderr.isatty(), keep_steps=False)
    table = mm.comparison(measured, mm.simulated(result.summary, result.requests))
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "measured_vs_simulated.csv", index=False)
    png = measured_vs_simulated(table, out / "measured_vs_simulated.png")
    print(mm.format_comparison(measured, table, workload))
    print(f"  outputs in {out}/ (measured_vs_simulated.csv, {png.name})")
    return 0


def cmd_topology(args) -> int:
    from simulator.hardware.specs import load_node  # noqa: PLC0415 - light, on use
    from simulator.paths import TOPOLOGIES  # noqa: PLC0415
    from simulator.topology.graph import build_graph  # noqa: PLC0415
    from simulator.topology.summary import draw, format_summary, summary  # noqa: PLC0415

    target = args.target
    is_preset = (TOPOLOGIES / f"{target}.toml").exists() or (
        target.endswith(".toml") and Path(target).exists()
        and "gpus_per_node" in read_text(target, "topology show"))
    if not is_preset and not Path(target).exists():
        from simulator.paths import catalog  # noqa: PLC0415

        raise ScenarioError(f"topology show: {target!r} is neither a node preset "
                            f"({', '.join(catalog(TOPOLOGIES, '.toml'))}) nor a scenario file")
    if args.nodes is not None and args.nodes < 1:
        raise ScenarioError(f"topology show --nodes: {args.nodes} must be at least 1")
    if args.oversubscription is not None and args.oversubscription < 1:
        raise ScenarioError(f"topology show --oversubscription: {args.oversubscription} must "
                            f"be at least 1 (downlink / uplink bandwidth)")
    if is_preset:
        node = load_node(target)
        g = build_graph(node, args.nodes or 1, args.fabric, args.oversubscription or 1.0)
    elif (sc := load_scenario(target, overrides=args.set, unsets=args.unset)).pools:
        return _show_pools(sc, args)
    else:
        c = sc.cluster
        node = cluster_node(sc)  # the preset with the scenario's NIC and switch overrides
        g = build_graph(node, args.nodes or c.nodes, args.fabric or c.fabric,
                        args.oversubscription or c.oversubscription, c.spines,
                        c.rail_optimized, c.nodes_per_leaf)
    print(format_summary(summary(g)))
    if args.png:
        draw(g, out_file(args.png, "topology show --png"))
        print(f"  drawing in {args.png}")
    return 0


def _show_pools(sc, args) -> int:
    """``topology show`` of a scenario with ``[[pools]]``: the graph that joins every pool's
    nodes (docs/disaggregation.md), and which nodes each pool holds."""
    from simulator.topology.summary import draw, format_summary, summary  # noqa: PLC0415

    given = [f for f, v in (("--nodes", args.nodes), ("--fabric", args.fabric),
                            ("--oversubscription", args.oversubscription)) if v is not None]
    if given:
        raise ScenarioError(f"topology show {' '.join(given)}: not with [[pools]] (each pool "
                            f"sets its nodes; --set cluster.fabric=... changes the fabric)",
                            source=sc.source)
    plan = build_plan(sc)
    print(format_summary(summary(plan.graph)))
    for p in plan.pools:
        nodes = sorted({plan.graph.nodes[g]["node"] for rp in p.replicas
                        for st in rp.placement.stages for g in st})
        print(f"  pool {p.spec.name} ({p.spec.role})  {p.node.name} "
              f"({p.node.gpu.name}), {p.gpus} GPUs on node{'s' if len(nodes) > 1 else ''} "
              f"{', '.join(map(str, nodes))}")
    if args.png:
        draw(plan.graph, args.png)
        print(f"  drawing in {args.png}")
    return 0


def cmd_collective(args) -> int:
    import json  # noqa: PLC0415 - light, on use

    from simulator.topology.measure import format_report, measure, report  # noqa: PLC0415

    res, sets = measure(args.topology, args.nodes, args.op, args.gpus, args.bytes,
                        args.concurrent, args.groups, args.algorithm, args.fabric,
                        args.oversubscription, not args.no_rail_optimized, args.nodes_per_leaf)
    info = report(res, sets)
    print(json.dumps(info) if args.json else format_report(info))
    return 0


def _with_unsets(args) -> None:
    """``--unset``, for the commands that take a scenario and its ``--set`` flags: the
    scenario is read here with both and handed on whole."""
    args.file = args.scenario
    if args.unset:
        args.scenario, args.set = load_scenario(args.scenario, overrides=args.set,
                                                unsets=args.unset), None


def cmd_plan(args) -> int:
    from simulator.planner import plan  # noqa: PLC0415 - on use
    from simulator.planner.report import (  # noqa: PLC0415
        LAUNCH,
        RECOMMENDED,
        format_plan,
        row_scenario,
        write_launch,
        write_plan,
    )

    _with_unsets(args)
    if args.autoscale is not None:
        return cmd_plan_day(args)
    if args.emit is not None and args.emit < 1:
        raise ScenarioError(f"--emit: a rank of plan.csv (1, 2, ...), got {args.emit}")
    # the whole space unless restricted: colocated and disaggregated in one ranking
    disagg = not args.colocated_only
    only = "disaggregated" if args.disagg_only else None

    if args.out:  # checked before the search: a plan whose files cannot be written is lost
        out_folder(args.out, "--out", create=False)
    kinds = None if args.nodes is None else [k.strip() for k in args.nodes.split(",")]
    if kinds is not None and not all(kinds):
        raise ScenarioError(f"plan --nodes: {excerpt(args.nodes)} names an empty node kind "
                            f"(give node presets or files, comma-separated, e.g. "
                            f"dgx-h100,hgx-h200)")
    if kinds:  # several node kinds (simulator/planner/kinds.py)
        from simulator.planner.kinds import plan_kinds  # noqa: PLC0415 - on use

        result = plan_kinds(args.scenario, kinds,
                            gpus=args.gpus, objective=args.objective, top=args.top,
                            requests=args.requests, jobs=args.jobs,
                            slo_quantile=args.slo_quantile, overrides=args.set,
                            disagg=disagg, only=only, progress=True,
                            backend=args.backend, address=args.ray_address)
    else:
        result = plan(args.scenario, gpus=args.gpus, objective=args.objective, top=args.top,
                      requests=args.requests, jobs=args.jobs, slo_quantile=args.slo_quantile,
                      overrides=args.set, disagg=disagg, only=only, progress=True,
                      backend=args.backend, address=args.ray_address)
    out = Path(args.out) if args.out else Path("runs") / f"{result.scenario.name}-plan"
    files = write_plan(result, out, figure=not args.no_plot)
    print(format_plan(result))
    print(f"  outputs in {out}/ ({', '.join(f.name for f in files)})")
    if result.interrupted:
        print(f"  stopped    by Ctrl-C after {len(result.table)} simulations: the answer is "
              f"from those")
    if result.best is not None:
        pick = out / RECOMMENDED
        print(f"  launch     {out / LAUNCH} (vLLM, SGLang, TensorRT-LLM)")
        print(f"  next       python -m simulator run {pick}\n"
              f"             python -m simulator capacity {pick}")
    if args.emit is not None:
        rows = result.table[result.table["rank"] == args.emit]
        if rows.empty:
            raise ScenarioError(f"--emit: no rank {args.emit} in plan.csv (ranks 1 to "
                                f"{len(result.table)})", source=args.scenario)
        where = out / f"launch-rank{args.emit}"
        written = write_launch(load_scenario(row_scenario(result, rows.iloc[0])), where)
        print(f"  emit       rank {args.emit}: {written[0]}\n" + written[0].read_text())
    if result.error:
        print(NoAnswer(result.error, source=args.scenario).render(), file=sys.stderr)
        return EXIT_NO_ANSWER
    return EXIT_INTERRUPTED if result.interrupted else 0


def cmd_plan_day(args) -> int:
    """``plan --autoscale [ATTAINMENT]``: the layout and replica bounds that serve a day at
    the lowest cost (docs/autoscaling.md, "Planning a day")."""
    from simulator.planner.day import format_day_plan, plan_day, write_day_plan  # noqa: PLC0415
    from simulator.planner.report import write_plan  # noqa: PLC0415

    taken = [flag for flag, given in (("--nodes", args.nodes), ("--disagg-only", args.disagg_only),
                                      ("--disagg", args.disagg), ("--emit", args.emit),
                                      ("--gpus", args.gpus)) if given]
    if taken:
        raise ScenarioError(f"plan --autoscale: {', '.join(taken)} not taken (it searches "
                            f"colocated layouts of the scenario's cluster, whose replicas "
                            f"scale)")
    if args.out:
        out_folder(args.out, "--out", create=False)
    result = plan_day(args.scenario, attainment=args.autoscale, top=min(args.top, 3),
                      requests=args.requests, jobs=args.jobs, overrides=args.set,
                      progress=True, backend=args.backend, address=args.ray_address)
    name = result.peak_plan.scenario.name
    out = Path(args.out) if args.out else Path("runs") / f"{name}-day-plan"
    files = write_plan(result.peak_plan, out, figure=not args.no_plot)
    files += write_day_plan(result, out)
    print(format_day_plan(result))
    print(f"  outputs in {out}/ ({', '.join(f.name for f in files)})")
    if result.best is None:
        return EXIT_NO_ANSWER
    print(f"  next       python -m simulator run {out / 'recommended-day.toml'}")
    return 0


def cmd_capacity(args) -> int:
    from simulator.planner import capacity  # noqa: PLC0415 - on use
    from simulator.planner.report import format_capacity, write_capacity  # noqa: PLC0415

    _with_unsets(args)
    if args.out:
        out_folder(args.out, "--out", create=False)
    result = capacity(args.scenario, slo_quantile=args.slo_quantile, tolerance=args.tolerance,
                      requests=args.requests, overrides=args.set, progress=True)
    out = Path(args.out) if args.out else Path("runs") / f"{result.scenario.name}-capacity"
    files = write_capacity(result, out, figure=not args.no_plot)
    print(format_capacity(result))
    print(f"  outputs in {out}/ ({', '.join(f.name for f in files)})")
    return EXIT_INTERRUPTED if result.interrupted else 0


def cmd_calibrate(args) -> int:
    if args.action == "collect":
        return cmd_collect(args)
    from simulator.calibration import commands as calibrate  # noqa: PLC0415 - scipy on use

    if args.data is None:
        raise ScenarioError(f"calibrate {args.action}: --data is required (a folder of "
                            "measured CSVs, or with --engine AIConfigurator's database)")
    return calibrate.main(args.action, args.gpu, args.data, args.out, args.engine)


def cmd_collect(args) -> int:
    from simulator.calibration import collect  # noqa: PLC0415 - PyTorch on use

    if args.out is None:
        raise ScenarioError("calibrate collect: --out is required (the folder to write into)")
    command = "python -m simulator " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        report = collect.collect(args.gpu, args.out, collect.parse_families(args.families),
                                 args.quick, args.timer, args.noise, args.seed,
                                 progress=sys.stderr.isatty(), command=command)
    except KeyboardInterrupt:
        print(f"calibrate collect: stopped; the rows timed so far are kept in {args.out}/ "
              "(the same command resumes)", file=sys.stderr)
        return 130
    print("\n".join(report.lines()))
    return 0


def _unset_flag(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--unset", action="append", metavar="KEY",
                     help="remove a key the scenario file sets, so its default applies, "
                          "e.g. --unset workload.rate_per_s")


class _OneLineParser(argparse.ArgumentParser):
    """Command-line misuse as one line on stderr (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    ap = _OneLineParser(prog="python -m simulator",
                        description="Simulate an LLM inference cluster.")
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="simulate a scenario (default: the embedded one)")
    r.add_argument("scenario", nargs="?", help="scenario TOML file")
    r.add_argument("--out", help="output folder, new or a previous run's, replaced whole "
                                 "(default runs/<name>/, runs/<name>-tp8-pp1/ with --set)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set parallel.tp=8")
    _unset_flag(r)
    r.add_argument("--seed", type=int, help="replace the scenario's seed")
    r.add_argument("--no-steps", action="store_true",
                   help="keep no per-step records (no steps.csv, no trace.json)")
    r.add_argument("--no-trace", action="store_true", help="do not write trace.json")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_run)
    v = sub.add_parser("validate", help="check a scenario and explain it; runs nothing")
    v.add_argument("scenario", nargs="?", help="scenario TOML file")
    v.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set parallel.tp=8")
    _unset_flag(v)
    v.set_defaults(func=cmd_validate)
    w = sub.add_parser("sweep", help="run a grid of scenario variants x seeds into a CSV")
    w.add_argument("scenario", help="base scenario TOML file")
    w.add_argument("--grid", required=True, help="grid TOML: dotted keys -> lists of values")
    w.add_argument("--seeds", type=int, default=1,
                   help="seeds 0..N-1 per point, N >= 1 (default 1)")
    w.add_argument("--jobs", type=int, help="local worker processes, >= 1 (default: the CPUs)")
    w.add_argument("--out", help="results CSV, appended and resumed "
                                 "(default runs/<name>-sweep.csv)")
    w.add_argument("--backend", choices=BACKENDS, default="local",
                   help="local: a process pool (default); ray: one Ray task per run")
    w.add_argument("--ray-address", help="Ray cluster address (default: start a local Ray)")
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    w.set_defaults(func=cmd_sweep)
    e = sub.add_parser("report", help="one self-contained HTML file of a run folder: "
                                      "summary, alerts, plots, scenario")
    e.add_argument("run", help="run folder (runs/<name>/); writes report.html into it")
    e.set_defaults(func=cmd_report)
    m = sub.add_parser("compare", help="summary figures of runs side by side, with "
                                       "differences, and their latency CDFs overlaid")
    m.add_argument("runs", nargs="+", help="two or more run folders; the first is the base "
                                           "(with --measured: one scenario TOML)")
    m.add_argument("--out", help="folder for compare.csv and compare_cdf.png "
                                 "(default runs/compare/; with --measured "
                                 "runs/<scenario>-measured/)")
    m.add_argument("--measured", metavar="FILE",
                   help="a benchmark result (vllm bench serve, sglang.bench_serving, "
                        "genai-perf, AIPerf, trtllm-bench): simulate the same benchmark on "
                        "the scenario's deployment and compare")
    m.add_argument("--day", action="store_true",
                   help="what each run of a day cost: GPU-hours, cost, energy, SLO "
                        "attainment (overall and worst window), cold starts")
    m.add_argument("--line", type=int, help="--measured JSON Lines file: which run (1-based)")
    m.add_argument("--concurrency", type=int,
                   help="--measured: the clients' concurrency, for files that do not record it")
    m.add_argument("--rate", type=float,
                   help="--measured: the request rate (req/s), for files that do not record it")
    m.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="--measured: override a scenario key, e.g. --set parallel.tp=8")
    _unset_flag(m)
    m.set_defaults(func=cmd_compare)
    t = sub.add_parser("topology", help="describe a cluster's graph")
    t.add_argument("action", choices=("show",))
    t.add_argument("target", help="node preset (dgx-h100, ...) or scenario TOML")
    t.add_argument("--nodes", type=arguments.nodes,
                   help="nodes (default: the scenario's, or 1)")
    t.add_argument("--fabric", choices=("single_switch", "leaf_spine"))
    t.add_argument("--oversubscription", type=arguments.oversubscription,
                   help="leaf_spine downlink/uplink ratio")
    t.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set parallel.tp=8")
    _unset_flag(t)
    t.add_argument("--png", help="draw the graph to this PNG")
    t.set_defaults(func=cmd_topology)
    k = sub.add_parser("collective", help="time collectives over a cluster's links")
    k.add_argument("--topology", default="dgx-h100", help="node preset (default dgx-h100)")
    k.add_argument("--nodes", type=arguments.nodes, default=1, help="nodes (default 1)")
    k.add_argument("--fabric", help="single_switch or leaf_spine (default: the preset's)")
    k.add_argument("--oversubscription", type=arguments.ratio, default=1.0,
                   help="leaf_spine ratio")
    k.add_argument("--no-rail-optimized", action="store_true",
                   help="leaf_spine: a node's NICs on its own leaf (traffic crosses spines)")
    k.add_argument("--nodes-per-leaf", type=arguments.nodes, default=1,
                   help="with --no-rail-optimized")
    k.add_argument("--op", default="all_reduce",
                   help="all_reduce, all_gather, reduce_scatter or send_recv")
    k.add_argument("--gpus", help="GPU indices: ranges and lists, e.g. 0-15, 0,8, 0-3,8-11")
    k.add_argument("--bytes", default="64MiB", help="buffer size: 64MiB, 1GB, 1e6 (default 64MiB)")
    k.add_argument("--concurrent", type=arguments.concurrent, default=1,
                   help="K identical collectives at once (next disjoint groups, or --groups)")
    k.add_argument("--groups", help="one GPU list per collective, e.g. '0-7;8-15'")
    k.add_argument("--algorithm", help="force ring, tree, nvls or hierarchical")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(func=cmd_collective)
    p = sub.add_parser("plot", help="PNG plots of a run folder or of a sweep CSV")
    p.add_argument("target", help="run folder (runs/<name>) or sweep results CSV")
    p.add_argument("--out", help="folder for the PNGs (default: next to the input)")
    p.add_argument("--x", help="sweep: swept key on the x axis")
    p.add_argument("--y", help="sweep: metric on the y axis")
    p.add_argument("--hue", help="sweep: one line per value of this key")
    p.set_defaults(func=cmd_plot)
    n = sub.add_parser("plan", help="search TP x PP x DP layouts and engine limits for a "
                                    "scenario; simulate the best and recommend one")
    n.add_argument("scenario", help="scenario TOML file (its layout is ignored)")
    n.add_argument("--gpus", type=arguments.gpus,
                   help="most GPUs a layout may use (default: all)")
    n.add_argument("--nodes", help="node kinds to search, comma-separated (e.g. "
                                   "dgx-h100,hgx-h200), each on the nodes --gpus needs")
    space = n.add_mutually_exclusive_group()
    space.add_argument("--colocated-only", action="store_true",
                       help="search colocated layouts only (default: colocated and "
                            "disaggregated prefill + decode pools in one ranking)")
    space.add_argument("--disagg-only", action="store_true",
                       help="search disaggregated prefill + decode pool layouts only")
    space.add_argument("--disagg", action="store_true",
                       help="colocated and disaggregated layouts (the default; kept for "
                            "old scripts)")
    n.add_argument("--objective", default="goodput_per_gpu",
                   help="goodput_per_gpu (default), goodput_per_usd, tokens_per_joule, "
                        "min_ttft or min_tpot")
    n.add_argument("--top", type=arguments.top, default=8,
                   help="candidates simulated (default 8), "
                                                      "plus the rule of thumb")
    n.add_argument("--requests", type=arguments.requests,
                   help="requests simulated per candidate (default: the scenario's, at "
                        "most 500); recommended.toml keeps the scenario's count")
    n.add_argument("--slo-quantile", type=arguments.quantile, default=0.99,
                   help="quantile of TTFT and TPOT held to the SLOs (default 0.99)")
    n.add_argument("--jobs", type=arguments.jobs, help="worker processes (default: the CPUs)")
    n.add_argument("--backend", choices=BACKENDS, default="local",
                   help="where the simulations run: local processes (default) or ray")
    n.add_argument("--ray-address", help="Ray cluster address (default: start a local Ray)")
    n.add_argument("--out", help="output folder (default runs/<name>-plan/)")
    n.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set parallel.tp=8")
    _unset_flag(n)
    n.add_argument("--no-plot", action="store_true", help="no pareto.png")
    n.add_argument("--autoscale", type=arguments.quantile, nargs="?", const=0.99,
                   metavar="ATTAINMENT",
                   help="plan a day: the layout and [autoscale] bounds at the lowest cost "
                        "with at least this SLO attainment over the workload's rate_profile "
                        "(default 0.99)")
    n.add_argument("--emit", type=int, metavar="RANK",
                   help="also write the launch commands of plan.csv's row RANK "
                        "(launch-rankRANK/launch.sh)")
    n.set_defaults(func=cmd_plan)
    y = sub.add_parser("capacity", help="highest request rate the scenario's layout "
                                        "sustains within its SLOs (bisection)")
    y.add_argument("scenario", help="scenario TOML file with a rate_per_s workload")
    y.add_argument("--slo-quantile", type=arguments.quantile, default=0.99,
                   help="quantile of TTFT and TPOT held to the SLOs (default 0.99)")
    y.add_argument("--tolerance", type=arguments.tolerance, default=0.05,
                   help="relative width of the final bracket (default 0.05)")
    y.add_argument("--requests", type=arguments.requests,
                   help="requests per probe (default: the scenario's, at most 2000)")
    y.add_argument("--out", help="output folder (default runs/<name>-capacity/)")
    y.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set parallel.tp=8")
    _unset_flag(y)
    y.add_argument("--no-plot", action="store_true", help="no capacity.png")
    y.set_defaults(func=cmd_capacity)
    c = sub.add_parser("calibrate", help="collect, check or fit a GPU's cost model on "
                                         "measured CSVs")
    c.add_argument("action", choices=("collect", "check", "fit"),
                   help="collect: time the kernels the fit needs on this machine's GPU; "
                        "check: predict the CSVs and report errors; fit: refit the GPU")
    c.add_argument("--gpu", required=True, help="GPU preset name or GPU TOML file")
    c.add_argument("--data", help="check, fit: folder with gemm.csv, attention_*.csv, ...; "
                                  "with --engine, AIConfigurator's database")
    c.add_argument("--engine", choices=("vllm", "sglang", "trtllm"),
                   help="check, fit: that engine's tables of AIConfigurator's database "
                        "(fit: half 0; check: the held-back half 1)")
    c.add_argument("--out", help="collect: folder to write the CSVs into; check: report CSV; "
                                 "fit: GPU TOML to write (default runs/calibration/<gpu>.toml)")
    c.add_argument("--families", help="collect: comma-separated families (default: gemm, "
                                      "attention_context, attention_generation, nccl)")
    c.add_argument("--quick", action="store_true",
                   help="collect: about a tenth of the shapes (every regime, a few minutes)")
    c.add_argument("--timer", default="torch", choices=("torch", "model"),
                   help="collect: torch times the local GPU (default); model prices the plan "
                        "with the simulator's own model of --gpu (a dry run)")
    c.add_argument("--noise", type=float, default=0.0,
                   help="collect --timer model: lognormal sigma of the stand-in's noise")
    c.add_argument("--seed", type=int, default=0, help="collect --timer model: noise seed")
    c.set_defaults(func=cmd_calibrate)
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # misuse (exit 2, one line) or --help (0), as a status
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except NoAnswer as exc:  # a fair question without an answer: nothing meets
        print(exc.render(), file=sys.stderr)
        return EXIT_NO_ANSWER
    except ScenarioError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a run's simulation loop: nothing kept
        print(f"{args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into head: stop quietly
        sys.stderr.close()
        return 0
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1
