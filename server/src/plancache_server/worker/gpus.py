"""Which GPUs this host has, without importing torch or CUDA in the gateway."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

log = logging.getLogger(__name__)


def visible_gpus() -> list[int]:
    """Indices of the GPUs a worker could use (honours CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return list(range(len(entries)))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("nvidia-smi failed (%s); assuming no GPU", e)
        return []
    return list(range(sum(1 for line in out.splitlines() if line.startswith("GPU "))))


def select_gpus(spec: str) -> list[int]:
    """'auto' -> every visible GPU, 'none' -> [], '0,2' -> [0, 2]."""
    spec = spec.strip().lower()
    if spec == "auto":
        return visible_gpus()
    if spec in ("none", ""):
        return []
    try:
        return [int(part) for part in spec.split(",")]
    except ValueError:
        raise ValueError(f"--gpus {spec!r}: expected 'auto', 'none' or indices like 0,1") from None
