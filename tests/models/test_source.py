"""The public checkpoint-reader interface (`ParamSource.read` / `finish`) over every fixture format.

Reads are compared with independent readers: ``safetensors.numpy`` for the HF
checkpoint, the ``gguf`` package (raw bytes and its dequantizer) for the GGUF
files, and a numpy version of llama.cpp's Q/K row permutation.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx.graph.weights import GGUFWeights, SafetensorWeights
from maxfx.models._source import Q8_0, CheckpointMismatchError, CheckpointSource, GGUFSource
from tests.models._helpers import LLAMA

Q_NAME = "model.layers.0.self_attn.q_proj.weight"
HEADS = 4  # tiny_llama's attention heads: the q rows of 4 heads of 16


def _gguf_source(fmt: str, dtype=DType.float32) -> tuple[GGUFSource, gguf.GGUFReader]:
    path = LLAMA / f"tiny_llama-{fmt}.gguf"
    return GGUFSource(GGUFWeights(path), str(path), dtype, "the test"), gguf.GGUFReader(path)


def _hf_rows(llama_cpp_rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores each head's rows as (pair, half) → HF's (half, pair)."""
    r = llama_cpp_rows.shape[0]
    return np.concatenate(
        [
            h.reshape(r // n_head // 2, 2, -1).transpose(1, 0, 2).reshape(r // n_head, -1)
            for h in np.split(llama_cpp_rows, n_head)
        ]
    )


def test_safetensors_reads_are_the_file_values_and_bfloat16_converts():
    ref = load_file(LLAMA / "model.safetensors")
    src = CheckpointSource(SafetensorWeights([LLAMA / "model.safetensors"]), "ckpt", None, "cfg")
    w = src.read(Q_NAME, (64, 64), rope_heads=HEADS, keep_blocks=True)  # HF order already; nothing is packed
    assert w.format is None
    np.testing.assert_array_equal(w.value, ref[Q_NAME])
    bf16 = CheckpointSource(SafetensorWeights([LLAMA / "model.safetensors"]), "ckpt", DType.bfloat16, "cfg").read(
        "model.norm.weight", (64,)
    )
    assert bf16.value.dtype == DType.bfloat16.to_numpy()
    np.testing.assert_allclose(bf16.value.astype(np.float32), ref["model.norm.weight"], rtol=1e-2)


@pytest.mark.parametrize("fmt, fmt_tag", [("q4_0", QuantizationEncoding.Q4_0), ("q8_0", Q8_0)])
def test_gguf_matrices_stay_packed_in_hf_row_order(fmt, fmt_tag):
    src, reader = _gguf_source(fmt)
    raw = {t.name: np.asarray(t.data) for t in reader.tensors}["blk.0.attn_q.weight"].view(np.uint8)
    packed = src.read(Q_NAME, (64, 64), rope_heads=HEADS, keep_blocks=True)
    assert packed.format == fmt_tag and packed.value.dtype == np.uint8
    np.testing.assert_array_equal(packed.value, _hf_rows(raw, HEADS))
    floats = src.read("model.layers.0.self_attn.k_proj.weight", (32, 64), rope_heads=2)  # no keep_blocks: dequantized
    qtype = getattr(gguf.GGMLQuantizationType, fmt.upper())
    k_raw = {t.name: np.asarray(t.data) for t in reader.tensors}["blk.0.attn_k.weight"].view(np.uint8)
    assert floats.format is None and floats.value.dtype == np.float32
    np.testing.assert_array_equal(floats.value, _hf_rows(gguf.quants.dequantize(k_raw, qtype), 2))


def test_gguf_info_names_the_stored_type():
    weights = GGUFWeights(LLAMA / "tiny_llama-q8_0.gguf")
    q = weights.blk[0].attn_q.weight.info()
    assert (q.storage_type, q.quantization_encoding, q.logical_shape) == (
        "Q8_0",
        None,
        (64, 64),
    )  # Q8_0: no MAX encoding
    assert weights.output_norm.weight.info().storage_type == "F32"
    assert SafetensorWeights([LLAMA / "model.safetensors"])[Q_NAME].info().storage_type is None
    with pytest.raises(KeyError, match="not a weight"):
        weights.blk[0].attn_qq.weight.info()


def test_mismatches_name_the_file_and_tensor():
    src, _ = _gguf_source("q4_0")
    with pytest.raises(
        CheckpointMismatchError,
        match=r"test-file: tensor 'blk\.0\.attn_q\.weight' has shape \[64, 64\] but the test needs \[32, 64\]",
    ):
        GGUFSource(GGUFWeights(LLAMA / "tiny_llama-q4_0.gguf"), "test-file", None, "the test").read(Q_NAME, (32, 64))
    with pytest.raises(
        CheckpointMismatchError,
        match=r"tensor 'blk\.7\.attn_q\.weight' \(HF 'model\.layers\.7\.self_attn\.q_proj\.weight'\) is missing",
    ):
        src.read("model.layers.7.self_attn.q_proj.weight", (64, 64))
    src.read("model.norm.weight", (64,))
    with pytest.raises(CheckpointMismatchError, match=r"tensor\(s\) are not part of the model the test describes"):
        src.finish()
