"""The embedded default scenario: Llama-3.1-70B on two DGX H100 nodes, TP4 x PP2 x DP2."""

DEFAULT_SCENARIO: dict = {
    "name": "llama70b-2xdgx",
    "seed": 1,
    "model": {"name": "llama-3.1-70b", "weight_dtype": "bf16", "kv_dtype": "bf16"},
    "cluster": {"topology": "dgx-h100", "nodes": 2},
    "parallel": {"tp": 4, "pp": 2, "dp": 2},
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "block_size": 16,
               "gpu_memory_utilization": 0.9},
    "router": {"policy": "round_robin"},
    "workload": {"arrival": "poisson", "rate_per_s": 4.0, "num_requests": 2000,
                 "prompt_tokens": {"dist": "lognormal", "mean": 1024, "sigma": 0.6,
                                   "max": 8192},
                 "output_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.5,
                                   "max": 4096}},
    "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
}
