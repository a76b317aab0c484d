"""Kubernetes deployments of a disaggregated pick: an NVIDIA Dynamo
``DynamoGraphDeployment`` and the values of llm-d's ``llm-d-modelservice`` Helm chart.

Both follow the projects' published examples (tests/data/manifests/ holds the two they
were taken from, with their source and licence): Dynamo's
``examples/backends/vllm/deploy/disagg.yaml`` (a Frontend, a ``VllmPrefillWorker`` and a
``VllmDecodeWorker``, each ``python3 -m dynamo.vllm --model M --disaggregation-mode
ROLE`` plus vLLM's engine flags) and llm-d's ``guides/pd-disaggregation/ms-pd/values.yaml``
(``prefill`` and ``decode`` with ``parallelism.tensor``, ``replicas`` and the ``vllm``
container's arguments, NIXL between them). Replicas are the pools' DP, GPUs per pod
``tp x pp``; the engine flags are those of :mod:`simulator.planner.launch` (its vLLM
command without ``vllm serve MODEL``; Dynamo sets up the KV transfer itself, so without
``--kv-transfer-config``). Images are the examples' (set your own tag).
"""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.planner.launch import Launch

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
