"""The graph Llama lowers for CUDA from this CPU machine, with the Pallas kernels in place.

``Model._stablehlo(..., platform="cuda")`` exports the engine program for CUDA
(`lowering.targets`): a ragged prefill holds the packed flash kernel and a decode
step the in-place paged decode kernel, one per layer; the Q4_0 GGUF model adds
the quantized-matmul kernels. On a GPU machine these are the programs XLA runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from maxfx.models import load_pretrained_graph

DATA = Path(__file__).resolve().parents[1] / "data" / "models" / "tiny_llama"
TRITON = "__gpu$xla.gpu.triton"
LAYERS = 2


def _kernels(text: str) -> list[str]:
    """Names of the Triton kernels in a lowered module (the ``name`` of each Triton custom call's config)."""
    names = []
    for chunk in text.split(TRITON)[1:]:
        start = chunk.index('name = "') + len('name = "')
        names.append(chunk[start : chunk.index('"', start)])
    return names


def _step_args(model, seq_ids, chunks):
    counts = [len(c) for c in chunks]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    return (np.concatenate(chunks).astype(np.int64), offsets, *model.cache.fetch(seq_ids, counts))


@pytest.mark.parametrize(
    "source, qmatmuls", [("model.safetensors", 0), ("tiny_llama-q4_0.gguf", 7)], ids=["f32", "q4_0"]
)  # Q4_0: q, k, v, o, gate, up, down
def test_prefill_and_decode_lower_for_cuda_with_the_kernels(source, qmatmuls):
    model = load_pretrained_graph(DATA if source.endswith("safetensors") else DATA / source, max_batch_size=2)
    seqs = [model.cache.claim(), model.cache.claim()]
    prefill = _kernels(
        model.compiled._stablehlo(*_step_args(model, seqs, [np.arange(5), np.arange(9)]), platform="cuda")
    )
    model.cache.step(seqs, [5, 9])
    decode = _kernels(
        model.compiled._stablehlo(*_step_args(model, seqs, [np.array([3]), np.array([4])]), platform="cuda")
    )
    assert prefill.count("flash_attention_fwd") == LAYERS and "paged_decode_attention" not in prefill
    assert decode.count("paged_decode_attention") == LAYERS and "flash_attention_fwd" not in decode
    for names in (prefill, decode):
        assert sum(n == "qmatmul_q4_0" for n in names) >= qmatmuls * LAYERS
    assert TRITON not in model.compiled._stablehlo(
        *_step_args(model, seqs, [np.array([1]), np.array([2])])
    )  # the CPU program
