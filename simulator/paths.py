"""Where the data folders (topologies/, workloads/) live."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root: data folders sit beside the package (editable install).
ROOT = Path(os.environ.get("SIMULATOR_DATA", Path(__file__).resolve().parent.parent))
TOPOLOGIES = ROOT / "topologies"
GPUS = TOPOLOGIES / "gpus"
WORKLOADS = ROOT / "workloads"
MODEL_CONFIGS = Path(__file__).resolve().parent / "model" / "configs"


def catalog(folder: Path, suffix: str) -> list[str]:
    """Names of the presets in ``folder`` (file stems with ``suffix``), sorted."""
    return sorted(p.stem for p in folder.glob(f"*{suffix}"))
