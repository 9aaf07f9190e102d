"""The compute precision of a backbone: ``dtype = "auto"`` and the devices each dtype runs on.

``"auto"`` (the default of every backbone that takes a ``dtype``) is bfloat16 on a CUDA device
and float32 elsewhere: half precision halves the memory and doubles the throughput of a GPU,
while on a CPU it is slower than float32 and moves the features (about 3e-3 for a tiny Llama,
1e-3 to 1e-2 for a ResNet) for nothing. An explicit ``"bfloat16"`` or ``"float16"`` is honoured
on the CPU as well (torch's CPU autocast for torchvision models, half-precision weights for
Hugging Face models). The resolved dtype, never ``"auto"``, enters the features' fingerprint,
so features computed in bfloat16 on a GPU and in float32 on a CPU never share a cache key.

The device a plan resolves ``"auto"`` for is the one the run will use
(:func:`etn_cli.planning.units.planned_device`), so the key written by ``etn status`` on a
laptop equals the one ``etn run`` uses there.
"""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device | str) -> str:
    """``"auto"`` -> ``"bfloat16"`` on CUDA, ``"float32"`` elsewhere; other names unchanged."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"
