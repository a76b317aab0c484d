"""Timers a collector measures shapes with: PyTorch on a real GPU, or the model itself.

A timer answers, for one family's shape table, the latency of each row and the kernel
that ran it, row by row (so a collection can be stopped and resumed without losing rows):
``measure(family, shapes)`` yields ``(index, latency_us, kernel_source)``, with
``latency_us = None`` for a row it cannot time on this machine (the reason goes in
``kernel_source`` and the collector's README).

- :class:`ModelTimer` prices each row with the simulator's own forms for a GPU preset (the
  same :func:`check.predict` that ``calibrate check`` uses), optionally with lognormal noise:
  a stand-in for tests and for a dry run of a collection plan on a laptop.
- :class:`TorchTimer` (:mod:`.torch_ops`) times each row on the local CUDA GPU with CUDA
  events over CUDA-graph replays, as AIConfigurator's collector does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np
import pandas as pd

from simulator.calibration import check
from simulator.hardware.specs import GPUSpec

Timed = tuple[int, "float | None", str]


class Timer(Protocol):
    """What a collector needs from a timer."""

    #: One line for the collection's README: what measured the rows.
    description: str

    def measure(self, family: str, shapes: pd.DataFrame) -> Iterator[Timed]:
        """``(row index, latency in microseconds or None, kernel_source)`` per row."""
        ...

    def max_gpus(self) -> int:
        """GPUs a collective may span on this machine."""
        ...


class ModelTimer:
    """The simulator's own prediction of each row for ``gpu`` (times ``exp(noise * z)``,
    ``z`` standard normal from ``seed``; ``noise = 0`` is exact)."""

    def __init__(self, gpu: GPUSpec, noise: float = 0.0, seed: int = 0, gpus: int = 8):
        self.gpu = gpu
        self.noise = float(noise)
        self.rng = np.random.default_rng(seed)
        self.gpus = int(gpus)
        self.description = (f"the simulator's own cost model of {gpu.name} (model timer, "
                            f"lognormal noise sigma {self.noise:g}, seed {seed}): a stand-in, "
                            "not a measurement")

    def max_gpus(self) -> int:
        return self.gpus

    def measure(self, family: str, shapes: pd.DataFrame) -> Iterator[Timed]:
        link = check.scale_up_for(self.gpu) if family == "nccl" else None
        seconds = check.predict(self.gpu, family, shapes.reset_index(drop=True), link)
        noise = np.exp(self.noise * self.rng.standard_normal(len(seconds)))
        for i, (s, f) in enumerate(zip(seconds, noise, strict=True)):
            yield i, float(s * f * 1e6), "model"
