"""Kubernetes deployments of a disaggregated pick: valid YAML, the published examples'
kinds and structure (tests/data/manifests/), the pools' replica counts and GPUs, and
engine flags the vLLM parser declares."""

from __future__ import annotations

from pathlib import Path

import yaml

from simulator.io.scenario import load_scenario, to_dict
from simulator.planner.report import DYNAMO, LLMD, write_launch
from tests.test_planner_launch import flag_list, parse

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "manifests"


def _scenario(prefill_dp: int, decode_dp: int, decode_tp: int):
    data = to_dict(load_scenario(ROOT / "workloads/disagg-70b-1p1d.toml"))
    data["_base_dir"] = str(ROOT / "workloads")
    pre, dec = data["pools"]
    pre.update(dp=prefill_dp, tp=4, nodes=1)
    dec.update(dp=decode_dp, tp=decode_tp, nodes=1)
    return load_scenario(data)


def _write(tmp_path, *shape):
    files = {f.name: f for f in write_launch(_scenario(*shape), tmp_path)}
    return (yaml.safe_load(files[DYNAMO].read_text()),
            yaml.safe_load(files[LLMD].read_text()))


def test_dynamo_deployment_follows_the_published_example(tmp_path):
    ours, _ = _write(tmp_path, 2, 3, 2)  # prefill 2 x TP4, decode 3 x TP2: 14 GPUs
    ref = yaml.safe_load((DATA / "dynamo-vllm-disagg.yaml").read_text())
    assert (ours["apiVersion"], ours["kind"]) == (ref["apiVersion"], ref["kind"])
    assert set(ours["spec"]["services"]) == set(ref["spec"]["services"])
    flags, _ = flag_list("vllm")
    want = {"VllmPrefillWorker": (2, "4"), "VllmDecodeWorker": (3, "2")}
    for name, svc in ours["spec"]["services"].items():
        r = ref["spec"]["services"][name]
        assert svc["componentType"] == r["componentType"]
        assert svc.get("subComponentType") == r.get("subComponentType")
        if name == "Frontend":
            assert svc["replicas"] == 1
            continue
        replicas, gpus = want[name]
        assert svc["replicas"] == replicas and svc["resources"]["limits"]["gpu"] == gpus
        main, rmain = svc["extraPodSpec"]["mainContainer"], r["extraPodSpec"]["mainContainer"]
        assert main["command"] == rmain["command"]
        assert main["args"][0] == "--model" and main["args"][2:4] == rmain["args"][2:4]
        d = parse(main["args"][4:], flags)  # the rest: vLLM's engine flags
        assert d["--tensor-parallel-size"] == gpus and "--kv-transfer-config" not in d


def test_llmd_values_follow_the_published_example(tmp_path):
    _, ours = _write(tmp_path, 2, 3, 2)
    ref = yaml.safe_load((DATA / "llm-d-ms-pd-values.yaml").read_text())
    assert set(ours) <= set(ref)
    assert ours["routing"]["proxy"]["connector"] == ref["routing"]["proxy"]["connector"]
    flags, _ = flag_list("vllm")
    for role, (replicas, tp) in {"prefill": (2, 4), "decode": (3, 2)}.items():
        mine, theirs = ours[role], ref[role]
        assert set(mine) <= set(theirs)
        assert mine["replicas"] == replicas and mine["parallelism"]["tensor"] == tp
        c, rc = mine["containers"][0], theirs["containers"][0]
        assert (c["name"], c["modelCommand"]) == (rc["name"], rc["modelCommand"])
        assert c["args"][:2] == ["--tensor-parallel-size", str(tp)]  # first, as llm-d asks
        assert parse(c["args"], flags)["--kv-transfer-config"] == \
            '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
        assert c["resources"]["limits"]["nvidia.com/gpu"] == str(tp)


def test_colocated_picks_get_no_manifests(tmp_path):
    s = load_scenario(ROOT / "workloads/plan-70b-1xdgx.toml", overrides=["parallel.tp=4"])
    names = {f.name for f in write_launch(s, tmp_path)}
    assert DYNAMO not in names and LLMD not in names
