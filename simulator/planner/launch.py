"""The commands that start a plan's pick on the real engines: ``vllm serve``,
``python -m sglang.launch_server`` and ``trtllm-serve``, one per replica shape.

A scenario (a plan's recommended.toml, or any runnable scenario) becomes one or more
:class:`Server` shapes: the colocated replicas of ``[parallel]``, or each ``[[pools]]``
entry (prefill, decode). Each shape maps to one command that starts **one replica**; a
shape with ``dp`` replicas runs that command ``dp`` times, each on its own ``tp x pp``
GPUs, behind a router (the simulator's replicas are independent servers behind its
router). Attention data parallel (MoE, ``attention_dp``) is inside one replica: vLLM's
``--data-parallel-size tp --enable-expert-parallel`` at TP1, SGLang's ``--dp-size tp
--enable-dp-attention``, TensorRT-LLM's ``enable_attention_dp``.

Flag names are those of the engines' argument parsers (tests/data/engine_flags/ lists
them with the engine version and source file; tests check every emitted flag is there and
parse each command back into the same layout). A setting an engine has no flag for is
said in :attr:`Launch.notes`, never dropped silently.

The Kubernetes deployments of a disaggregated pick (:func:`dynamo`, :func:`llmd`): an NVIDIA
Dynamo ``DynamoGraphDeployment`` and the values of llm-d's ``llm-d-modelservice`` Helm chart.

Both follow the projects' published examples (tests/data/manifests/ holds the two they
were taken from, with their source and licence): Dynamo's
``examples/backends/vllm/deploy/disagg.yaml`` (a Frontend, a ``VllmPrefillWorker`` and a
``VllmDecodeWorker``, each ``python3 -m dynamo.vllm --model M --disaggregation-mode
ROLE`` plus vLLM's engine flags) and llm-d's ``guides/pd-disaggregation/ms-pd/values.yaml``
(``prefill`` and ``decode`` with ``parallelism.tensor``, ``replicas`` and the ``vllm``
container's arguments, NIXL between them). Replicas are the pools' DP, GPUs per pod
``tp x pp``; the engine flags are those of :func:`launch` (its vLLM
command without ``vllm serve MODEL``; Dynamo sets up the KV transfer itself, so without
``--kv-transfer-config``). Images are the examples' (set your own tag).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from simulator.cluster.running import check
from simulator.errors import ScenarioError
from simulator.io.schema import Scenario
from simulator.model.spec import MODEL_CONFIGS

ENGINES = ("vllm", "sglang", "trtllm")

#: Hugging Face repositories of the bundled models whose config has no ``_source``.
HF_REPOS = {
    "deepseek-v3": "deepseek-ai/DeepSeek-V3", "deepseek-r1": "deepseek-ai/DeepSeek-R1",
    "gpt-oss-120b": "openai/gpt-oss-120b", "gpt-oss-20b": "openai/gpt-oss-20b",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    "llama-4-maverick": "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1", "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
}
#: Weight dtype -> vLLM / SGLang ``--quantization`` (None: unquantized, ``--dtype``).
QUANTIZATION = {"bf16": None, "fp16": None, "fp8": "fp8", "fp4": "modelopt_fp4",
                "int4": "awq", "int8": "w8a8_int8"}
DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
#: Speculative method -> (vLLM method, SGLang algorithm, TensorRT-LLM decoding_type).
SPECULATIVE = {"eagle": ("eagle", "EAGLE", "Eagle"), "mtp": ("deepseek_mtp", "NEXTN", "MTP"),
               "ngram": ("ngram", "NGRAM", "NGram"),
               "draft_model": ("draft_model", "STANDALONE", "Draft_Target")}


@dataclass(frozen=True)
class Server:
    """One replica shape: what a launch command needs."""

    role: str  # mixed (colocated), prefill or decode
    replicas: int
    tp: int
    pp: int
    ep: int
    attention_dp: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked: bool  # prompts split across steps (chunked prefill)
    max_model_len: int
    gpu_memory_utilization: float
    weight_dtype: str
    kv_dtype: str
    prefix_caching: bool
    spec_method: str | None = None
    spec_k: int = 0
    draft_model: str | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


@dataclass
class Launch:
    """Per engine, one ``(server, argv)`` per replica shape, and what the flags cannot
    say (``notes``); ``extra`` holds TensorRT-LLM's ``--extra_llm_api_options`` YAML
    (as a dict) per shape."""

    model: str
    servers: list[Server]
    commands: dict[str, list[list[str]]] = field(default_factory=dict)
    extra: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def text(self, engine: str) -> str:
        """The commands of one engine as shell lines, each with its replica count."""
        lines = []
        for server, argv in zip(self.servers, self.commands[engine], strict=True):
            lines.append(f"# {server.role}: {server.replicas} replica(s) of {server.gpus} "
                         f"GPU(s) each, behind a router")
            lines.append(shlex.join(argv))
        return "\n".join(lines)


def model_id(name: str) -> str:
    """The Hugging Face repository of a model name: the catalog config's ``_source`` (the
    bundled configs record where they came from), :data:`HF_REPOS`, or the name as given
    (a repository id or a path the user chose)."""
    if name in HF_REPOS:
        return HF_REPOS[name]
    path = MODEL_CONFIGS / f"{name}.json"
    if path.is_file():
        source = json.loads(path.read_text()).get("_source")
        if source:
            return source.split()[0]
    return name


def servers(s: Scenario, max_len: int) -> list[Server]:
    """The replica shapes of a scenario: ``[parallel]`` colocated, or one per pool;
    ``max_len`` is the longest request the built cluster takes (its ``max_model_len``: the
    engines refuse to start when their KV cache cannot hold one at their default)."""
    e, m = s.engine, s.model
    spec = s.speculative

    def make(role, dp, tp, pp, ep, adp, engine: dict, kv, speculates: bool) -> Server:
        seqs = engine.get("max_num_seqs", e.max_num_seqs)
        budget = engine.get("max_num_batched_tokens", e.max_num_batched_tokens)
        scheduler = engine.get("scheduler", e.scheduler)
        args = engine.get("scheduler_args", e.scheduler_args) or {}
        chunked = scheduler in ("vllm", "sarathi")
        if scheduler == "sarathi" and "chunk_size" in args:
            budget = int(args["chunk_size"])
        length = engine.get("max_model_len", max_len)
        on = speculates and spec is not None
        return Server(role, dp, tp, pp, ep, adp, int(seqs), int(budget), chunked,
                      int(length), float(engine.get("gpu_memory_utilization",
                                                    e.gpu_memory_utilization)),
                      m.weight_dtype, kv or m.kv_dtype,
                      bool(engine.get("prefix_caching", e.prefix_caching)),
                      spec.method if on else None, spec.num_speculative_tokens if on else 0,
                      spec.draft_model if on else None)

    if not s.pools:
        p = s.parallel
        return [make("mixed", p.dp, p.tp, p.pp, p.ep, p.attention_dp, {}, None, True)]
    return [make(q.role, q.dp, q.tp, q.pp, q.ep, q.attention_dp, q.engine or {}, q.kv_dtype,
                 q.role != "prefill" and q.speculative is not False) for q in s.pools]


def _vllm(model: str, v: Server) -> list[str]:
    tp, dp = (1, v.tp) if v.attention_dp else (v.tp, 1)  # attention DP: DP ranks, TP1
    argv = ["vllm", "serve", model, "--tensor-parallel-size", str(tp),
            "--pipeline-parallel-size", str(v.pp)]
    if dp > 1:
        argv += ["--data-parallel-size", str(dp)]
    if v.ep > 1:
        argv.append("--enable-expert-parallel")
    # vLLM schedules each DP rank on its own: the replica's limits split over its ranks,
    # as the simulator splits an attention-DP batch (simulator.model.memory)
    seqs, budget = -(-v.max_num_seqs // dp), -(-v.max_num_batched_tokens // dp)
    argv += ["--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(budget),
             "--enable-chunked-prefill" if v.chunked else "--no-enable-chunked-prefill",
             "--max-model-len", str(v.max_model_len),
             "--gpu-memory-utilization", f"{v.gpu_memory_utilization:g}"]
    argv += _precision(v, "--quantization", "--dtype")
    if v.kv_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    argv.append("--enable-prefix-caching" if v.prefix_caching else "--no-enable-prefix-caching")
    if v.spec_method:
        cfg = {"method": SPECULATIVE[v.spec_method][0], "num_speculative_tokens": v.spec_k}
        if v.draft_model:
            cfg["model"] = v.draft_model
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
    if v.role in ("prefill", "decode"):  # NIXL moves the KV between the pools
        argv += ["--kv-transfer-config",
                 json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                            separators=(",", ":"))]
    return argv


def _sglang(model: str, v: Server) -> list[str]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", model,
            "--tp-size", str(v.tp), "--pp-size", str(v.pp)]
    if v.attention_dp:
        argv += ["--dp-size", str(v.tp), "--enable-dp-attention"]
    if v.ep > 1:
        argv += ["--ep-size", str(v.ep)]
    argv += ["--max-running-requests", str(v.max_num_seqs),
             "--chunked-prefill-size", str(v.max_num_batched_tokens if v.chunked else -1),
             "--max-prefill-tokens", str(v.max_num_batched_tokens),
             "--context-length", str(v.max_model_len),
             "--mem-fraction-static", f"{v.gpu_memory_utilization:g}"]
    argv += _precision(v, "--quantization", "--dtype")
    if v.kv_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8_e4m3"]
    if not v.prefix_caching:
        argv.append("--disable-radix-cache")
    if v.spec_method:
        argv += ["--speculative-algorithm", SPECULATIVE[v.spec_method][1],
                 "--speculative-num-steps", str(v.spec_k), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(v.spec_k + 1)]
        if v.draft_model:
            argv += ["--speculative-draft-model-path", v.draft_model]
    if v.role in ("prefill", "decode"):
        argv += ["--disaggregation-mode", v.role]
    return argv


def _trtllm(model: str, v: Server, extra_file: str) -> tuple[list[str], dict]:
    argv = ["trtllm-serve", model, "--backend", "pytorch", "--tp_size", str(v.tp),
            "--pp_size", str(v.pp)]
    if v.ep > 1:
        argv += ["--ep_size", str(v.ep)]
    argv += ["--max_batch_size", str(v.max_num_seqs),
             "--max_num_tokens", str(v.max_num_batched_tokens),
             "--max_seq_len", str(v.max_model_len),
             "--kv_cache_free_gpu_memory_fraction", f"{v.gpu_memory_utilization:g}"]
    if v.chunked:
        argv.append("--enable_chunked_prefill")
    # What trtllm-serve has no flag for goes in the LLM API options file (llm_args.py).
    extra: dict = {"kv_cache_config": {"enable_block_reuse": v.prefix_caching}}
    if v.kv_dtype == "fp8":
        extra["kv_cache_config"]["dtype"] = "fp8"
    if v.attention_dp:
        extra["enable_attention_dp"] = True
    if v.spec_method:
        extra["speculative_config"] = {"decoding_type": SPECULATIVE[v.spec_method][2],
                                       "max_draft_len": v.spec_k}
        if v.draft_model:
            extra["speculative_config"]["speculative_model_dir"] = v.draft_model
    argv += ["--extra_llm_api_options", extra_file]
    return argv, extra


def _precision(v: Server, quant_flag: str, dtype_flag: str) -> list[str]:
    if v.weight_dtype not in QUANTIZATION:
        raise ScenarioError(f"model.weight_dtype: {v.weight_dtype!r} has no engine "
                            f"quantization to launch (allowed: {', '.join(QUANTIZATION)})")
    q = QUANTIZATION[v.weight_dtype]
    return [quant_flag, q] if q else [dtype_flag, DTYPE[v.weight_dtype]]


def launch(s: Scenario) -> Launch:
    """The launch commands of a scenario on every engine (:data:`ENGINES`).

    Raises
    ------
    ScenarioError
        A weight dtype or speculative method no engine flag expresses.
    """
    model = model_id(s.model.name)
    shapes = servers(s, check(s)[0].max_model_len)
    out = Launch(model, shapes, {e: [] for e in ENGINES})
    for i, v in enumerate(shapes):
        if v.spec_method is not None and v.spec_method not in SPECULATIVE:
            raise ScenarioError(f"speculative.method: {v.spec_method!r} has no engine flag "
                                f"(allowed: {', '.join(SPECULATIVE)})")
        out.commands["vllm"].append(_vllm(model, v))
        out.commands["sglang"].append(_sglang(model, v))
        argv, extra = _trtllm(model, v, f"{v.role}-{i}.yaml" if len(shapes) > 1
                              else "extra_llm_api_options.yaml")
        out.commands["trtllm"].append(argv)
        out.extra.append(extra)
    if any(v.role != "mixed" for v in shapes):
        out.notes.append("disaggregated: vLLM pools exchange KV through NIXL "
                         "(--kv-transfer-config), SGLang through --disaggregation-mode; "
                         "a router pairs prefill and decode servers (Dynamo, llm-d)")
    if any(v.spec_method in ("eagle", "mtp") and not v.draft_model for v in shapes):
        out.notes.append("speculative eagle/mtp: vLLM and SGLang load the model's own "
                         "draft head (MTP) or need its path in the speculative config")
    return out


DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:my-tag"
LLMD_IMAGE = "ghcr.io/llm-d/llm-d-cuda:v0.3.1"
WORKER = {"prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker"}


def _engine_args(argv: list[str], keep_transfer: bool) -> list[str]:
    """A vLLM command's flags without ``vllm serve MODEL`` (and, unless kept, without
    ``--kv-transfer-config`` and its value)."""
    args = argv[3:]
    if not keep_transfer and "--kv-transfer-config" in args:
        i = args.index("--kv-transfer-config")
        args = args[:i] + args[i + 2:]
    return args


def _pools(found: Launch) -> list[tuple]:
    pools = [(v, argv) for v, argv in zip(found.servers, found.commands["vllm"], strict=True)
             if v.role in WORKER]
    if len(pools) != 2 or {v.role for v, _ in pools} != {"prefill", "decode"}:
        raise ScenarioError("pools: a Dynamo or llm-d deployment needs one prefill and one "
                            "decode pool")
    return pools


def dynamo(found: Launch, name: str) -> dict:
    """The ``DynamoGraphDeployment`` of a prefill + decode launch."""
    services: dict = {"Frontend": {"componentType": "frontend", "replicas": 1,
                                   "extraPodSpec": {"mainContainer": {"image": DYNAMO_IMAGE}}}}
    for v, argv in _pools(found):
        services[WORKER[v.role]] = {
            "envFromSecret": "hf-token-secret", "componentType": "worker",
            "subComponentType": v.role, "replicas": v.replicas,
            "resources": {"limits": {"gpu": str(v.gpus)}},
            "extraPodSpec": {"mainContainer": {
                "image": DYNAMO_IMAGE, "workingDir": "/workspace/examples/backends/vllm",
                "command": ["python3", "-m", "dynamo.vllm"],
                "args": ["--model", found.model, "--disaggregation-mode", v.role,
                         *_engine_args(argv, keep_transfer=False)]}}}
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": name}, "spec": {"services": services}}


def llmd(found: Launch) -> dict:
    """The llm-d-modelservice Helm values of a prefill + decode launch."""
    out: dict = {"multinode": False,
                 "modelArtifacts": {"uri": f"hf://{found.model}", "name": found.model,
                                    "authSecretName": "llm-d-hf-token"},
                 "routing": {"servicePort": 8000,
                             "proxy": {"connector": "nixlv2", "secure": False}}}
    for v, argv in _pools(found):
        gpus = str(v.gpus)
        out[v.role] = {
            "create": True, "replicas": v.replicas,
            "parallelism": {"tensor": v.tp, "data": 1},
            "containers": [{
                "name": "vllm", "image": LLMD_IMAGE, "modelCommand": "vllmServe",
                # llm-d keeps tensor parallelism as the first arguments
                "args": _engine_args(argv, keep_transfer=True),
                "resources": {"limits": {"nvidia.com/gpu": gpus},
                              "requests": {"nvidia.com/gpu": gpus}}}]}
    return out
