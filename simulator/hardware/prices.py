"""GPU-hour prices (USD) per GPU, the defaults of ``[cluster] gpu_hour_usd``.

On-demand list prices of CoreWeave, per GPU (the 8-GPU HGX instance price / 8; GB200 NVL72
the 4-GPU slice / 4), as publicly listed in February 2026 (coreweave.com/pricing, quoted in
https://kaelresearch.com/blog/gpu-economics-real-inference-costs). Prices move; set
``[cluster] gpu_hour_usd`` (or ``[[pools]] gpu_hour_usd``) for your own.
"""

from __future__ import annotations

#: USD per GPU-hour by GPU preset name (topologies/gpus/<name>.toml).
GPU_HOUR_USD: dict[str, float] = {
    "h100_sxm": 49.24 / 8,   # HGX H100 8x: $49.24/h
    "h200_sxm": 50.44 / 8,   # HGX H200 8x: $50.44/h
    "b200": 68.80 / 8,       # HGX B200 8x: $68.80/h
    "gb200": 42.00 / 4,      # GB200 NVL72, 4-GPU slice: $42.00/h
    "a100_sxm": 21.60 / 8,   # HGX A100 80GB 8x: $21.60/h
    "l40s": 18.00 / 8,       # L40S 8x: $18.00/h
}
#: When the prices were read.
PRICES_DATE = "2026-02"


def gpu_hour_usd(gpu: str, override: float | None = None) -> float:
    """The price of one GPU-hour of ``gpu``: ``override`` when set, else the table; NaN
    for a GPU the table lacks (a custom GPU file) unless overridden."""
    if override is not None:
        return float(override)
    return GPU_HOUR_USD.get(gpu, float("nan"))
