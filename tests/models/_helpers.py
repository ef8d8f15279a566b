"""Shared helpers of the model tests: fixture paths, golden files, cached loads."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from maxfx.models import load_pretrained

DATA = Path(__file__).resolve().parents[1] / "data" / "models"
LLAMA = DATA / "tiny_llama"
GPT2 = DATA / "tiny_gpt2"

# Required by the fixtures' README: 1e-4. Measured here ~3e-6 (llama) and ~1e-5 (gpt2,
# whose logits reach 20), so the tests hold a tighter bound.
FP32_ATOL = 2e-5
# GGUF Q8_0 / Q4_0 on a CPU run the custom_calls/cpu kernels, which round the
# activations to int16 per 32 values: the tiny Llama's logits move by up to ~3e-4
# against the float golden (greedy tokens stay identical). With the kernels
# switched off (the `float_products` fixture) the GGUF goldens hold to FP32_ATOL.
QUANT_KERNEL_ATOL = 1e-3


def golden(folder: Path, name: str = "golden.npz") -> dict[str, np.ndarray]:
    with np.load(folder / name) as z:
        return {k: z[k] for k in z.files}


@functools.cache
def model(path: str):
    """One load per checkpoint for the whole test session (models are not mutated by the tests)."""
    return load_pretrained(path)
