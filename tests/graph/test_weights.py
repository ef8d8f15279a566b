"""maxfx.graph.weights: safetensors, PyTorch and GGUF loaders, the Weights tree, bad files.

Oracles are independent of maxfx: the ``safetensors`` package's own parser, the
``gguf`` package's dequantizer, and hand-written files (raw safetensors bytes,
pickle opcodes for ``torch.save`` zips).
"""

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from maxfx.dtype import DType
from maxfx.graph.quantization import QuantizationEncoding
from maxfx.graph.weights import (
    GGUFWeights,
    PytorchWeights,
    SafetensorWeights,
    WeightData,
    Weights,
    WeightsFormat,
    load_weights,
    weights_format,
)
from maxfx.graph.weights._progress import progress_bar
from tests.pickle_ops import p_int, p_ints, p_str

DATA = Path(__file__).parents[1] / "data" / "models"
LLAMA = DATA / "tiny_llama"
GPT2 = DATA / "tiny_gpt2"
MODELS = [LLAMA, GPT2]


# -- helpers: independent writers -------------------------------------------------

_ST_CODES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.int64): "I64",
}


def write_safetensors(path, tensors, metadata=None):
    """Hand-rolled safetensors writer (handles bfloat16, which safetensors.numpy cannot)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {
            "dtype": _ST_CODES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def _p_value(v):
    if isinstance(v, dict):
        return b"}(" + b"".join(p_str(k) + _p_value(x) for k, x in v.items()) + b"u"
    if isinstance(v, int):
        return p_int(v)
    stype, key, numel, offset, size, stride, *v3_dtype = v
    storage = (
        b"((" + p_str("storage") + f"ctorch\n{stype}\n".encode() + p_str(key) + p_str("cpu") + p_int(numel) + b"tQ"
    )
    args = storage + p_int(offset) + p_ints(size) + p_ints(stride) + b"\x89ccollections\nOrderedDict\n)R"
    if v3_dtype:  # _rebuild_tensor_v3: untyped storage plus a torch.<dtype> global
        return b"ctorch._utils\n_rebuild_tensor_v3\n" + args + f"ctorch\n{v3_dtype[0]}\n".encode() + b"tR"
    return b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"tR"


def torch_state_pickle(state):
    """The pickle torch.save writes for ``state`` (protocol 2 opcodes, written by hand)."""
    return b"\x80\x02" + _p_value(state) + b"."


def write_torch_zip(path, pickled, storages, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compress) as zf:
        zf.writestr("archive/data.pkl", pickled)
        zf.writestr("archive/byteorder", "little")
        for key, arr in storages.items():
            zf.writestr(f"archive/data/{key}", np.ascontiguousarray(arr).tobytes())


# -- safetensors and .bin -----------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.name)
def test_safetensors_and_pytorch_bin_agree_exactly(model):
    reference = safetensors.numpy.load_file(model / "model.safetensors")  # the safetensors package's parser
    st = SafetensorWeights([model / "model.safetensors"])
    pt = PytorchWeights(model / "pytorch_model.bin")
    assert sorted(n for n, _ in st.items()) == sorted(reference)
    assert sorted(n for n, _ in pt.items()) == sorted(reference)
    for name, ref in reference.items():
        for weights in (st, pt):
            wd = weights[name].data()
            arr = np.from_dlpack(wd)
            assert arr.dtype == ref.dtype and arr.shape == ref.shape, name
            np.testing.assert_array_equal(arr, ref, err_msg=name)
            assert wd.dtype is DType.float32 and wd.shape == list(ref.shape) and wd.name == name


def test_hierarchical_names_exists_and_items():
    weights = SafetensorWeights([LLAMA / "model.safetensors"])
    q = weights.model.layers[0].self_attn.q_proj.weight
    assert q.name == "model.layers.0.self_attn.q_proj.weight"
    assert q.exists() and not weights.model.layers[0].exists() and not weights.model.nope.weight.exists()
    assert weights.model.layers[1].name == "model.layers.1"
    rel = dict(weights.model.layers[1].items())
    assert sorted(rel) == sorted(
        ["input_layernorm.weight", "post_attention_layernorm.weight"]
        + [f"self_attn.{p}_proj.weight" for p in "qkvo"]
        + [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    )
    assert rel["mlp.up_proj.weight"].name == "model.layers.1.mlp.up_proj.weight"
    assert len(list(weights.items())) == 21
    assert isinstance(weights, Weights)
    assert "self_attn" in dir(weights.model.layers[0])


def test_items_match_whole_components(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors.numpy.save_file(
        {
            "layers.1.w": np.zeros(2, np.float32),
            "layers.10.w": np.ones(2, np.float32),
            "layers.1": np.ones(1, np.float32),
        },
        path,
    )
    weights = SafetensorWeights([path])
    assert sorted(n for n, _ in weights.layers[1].items()) == ["", "w"]
    assert [n for n, _ in weights.layers[10].items()] == ["w"]


def test_data_keyerror_suggests_close_names():
    weights = SafetensorWeights([LLAMA / "model.safetensors"])
    with pytest.raises(KeyError, match="Did you mean 'model.layers.0.self_attn.q_proj.weight'"):
        weights.model.layers[0].self_attn.q_proj.weigth.data()
    with pytest.raises(KeyError, match="prefix of 9 weight"):
        weights.model.layers[0].data()
    with pytest.raises(KeyError):
        weights.nothing.allocate()


def test_allocate_validates_and_records_values():
    weights = SafetensorWeights([LLAMA / "model.safetensors"])
    emb = weights.model.embed_tokens.weight
    w = emb.allocate(dtype=DType.float32, shape=(256, 64))
    assert (w.name, w.dtype, w.shape) == ("model.embed_tokens.weight", DType.float32, [256, 64])
    np.testing.assert_array_equal(weights.allocated_weights["model.embed_tokens.weight"], emb.data().to_numpy())
    with pytest.raises(ValueError, match=r"model.norm.weight.*expected shape \[65\].*\[64\]"):
        weights.model.norm.weight.allocate(shape=[65])
    with pytest.raises(ValueError, match="int32"):
        weights.model.norm.weight.allocate(dtype=DType.int32)
    with pytest.raises(ValueError, match="unquantized"):
        weights.model.norm.weight.allocate(quantization_encoding=QuantizationEncoding.Q4_0)
    # A different float dtype converts (a copy, rounded as numpy/ml_dtypes round).
    half = weights.lm_head.weight.allocate(dtype=DType.float16)
    value = weights.allocated_weights["lm_head.weight"]
    assert half.dtype is DType.float16 and value.dtype == np.float16
    np.testing.assert_array_equal(value, weights.lm_head.weight.data().to_numpy().astype(np.float16))
    # Children share the allocated dict with the root.
    assert weights.model.allocated_weights is weights.allocated_weights


def test_allocate_as_bytes(tmp_path):
    weights = SafetensorWeights([LLAMA / "model.safetensors"])
    w = weights.model.layers[0].mlp.down_proj.weight.allocate_as_bytes()
    assert (w.dtype, w.shape) == (DType.uint8, [64, 512])
    raw = weights.allocated_weights["model.layers.0.mlp.down_proj.weight"]
    assert raw.dtype == np.uint8
    np.testing.assert_array_equal(raw.view(np.float32), weights.model.layers[0].mlp.down_proj.weight.data().to_numpy())
    path = tmp_path / "s.safetensors"
    write_safetensors(path, {"scale": np.array(2.5, np.float32)})
    scalar = SafetensorWeights([path])
    assert scalar.scale.allocate_as_bytes(DType.float32).shape == [4]
    with pytest.raises(ValueError, match="float16"):
        scalar.scale.allocate_as_bytes(DType.float16)


def test_bfloat16_safetensors_load_as_ml_dtypes(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16)
    path = tmp_path / "bf16.safetensors"
    write_safetensors(path, {"w": values, "ids": np.arange(4, dtype=np.int64)}, metadata={"format": "pt"})
    weights = SafetensorWeights([path])
    wd = weights.w.data()
    assert wd.dtype is DType.bfloat16 and wd.to_numpy().dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(wd.to_numpy().view(np.uint16), values.view(np.uint16))
    assert weights.ids.data().dtype is DType.int64
    assert weights.metadata == {"format": "pt"}
    f32 = wd.astype(DType.float32)
    np.testing.assert_array_equal(f32.to_numpy(), values.astype(np.float32))


def test_core_safe_open_reads_what_the_safetensors_package_wrote(tmp_path):
    from maxfx._core.safetensors import safe_open
    from maxfx.driver import CPU

    rng = np.random.default_rng(1)
    tensors = {"b": rng.standard_normal((2, 3)).astype(np.float32), "a/fancy.name": np.arange(5, dtype=np.int32)}
    path = tmp_path / "t.safetensors"
    safetensors.numpy.save_file(tensors, path, metadata={"format": "np"})
    with safe_open(path, device=CPU()) as f:
        assert sorted(f.keys()) == sorted(tensors)
        assert f.metadata() == {"format": "np"}
        for name, want in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype is DType.from_numpy(want.dtype) and tuple(got.shape) == want.shape
            np.testing.assert_array_equal(got.to_numpy(), want)
        with pytest.raises(KeyError, match="'missing' is not a tensor"):
            f.get_tensor("missing")
    safetensors.numpy.save_file(tensors, tmp_path / "plain.safetensors")
    assert safe_open(tmp_path / "plain.safetensors").metadata() == {}
    with pytest.raises(ValueError, match="cannot read safetensors file"):
        safe_open(tmp_path / "absent.safetensors")


def test_sharded_safetensors(tmp_path):
    reference = safetensors.numpy.load_file(LLAMA / "model.safetensors")
    names = sorted(reference)
    shards = [tmp_path / "model-00001-of-00002.safetensors", tmp_path / "model-00002-of-00002.safetensors"]
    safetensors.numpy.save_file({n: reference[n] for n in names[:10]}, shards[0])
    safetensors.numpy.save_file({n: reference[n] for n in names[10:]}, shards[1])
    weights = load_weights(shards)
    assert isinstance(weights, SafetensorWeights)
    assert sorted(n for n, _ in weights.items()) == names
    for n in names:
        np.testing.assert_array_equal(weights[n].data().to_numpy(), reference[n])
    safetensors.numpy.save_file({names[0]: reference[names[0]]}, tmp_path / "dup.safetensors")
    with pytest.raises(ValueError, match="must not overlap"):
        SafetensorWeights([shards[0], tmp_path / "dup.safetensors"])


# -- PyTorch reader details ------------------------------------------------------------


def test_pytorch_properties_and_missing_names():
    weights = PytorchWeights(GPT2 / "pytorch_model.bin")
    c_attn = weights.transformer.h[0].attn.c_attn.weight
    assert c_attn.dtype is DType.float32 and c_attn.shape == [64, 192] and c_attn.quantization_encoding is None
    with pytest.raises(KeyError, match="transformer.h.0.attn.c_attn.weight"):
        _ = weights.transformer.h[0].attn.c_attn.weigth.shape
    assert isinstance(weights, Weights)


@pytest.mark.parametrize("compress", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"])
def test_pytorch_offsets_strides_and_nesting(tmp_path, compress):
    base = np.arange(24, dtype=np.float32)
    half = np.arange(6, dtype=np.float16)
    state = {
        "a.weight": ("FloatStorage", "0", 24, 0, (2, 3), (3, 1)),
        "a.bias": ("FloatStorage", "0", 24, 6, (4,), (1,)),  # shares storage 0 at an offset
        "a.t": ("FloatStorage", "0", 24, 0, (3, 2), (1, 3)),  # a transposed view (non-contiguous)
        "b": {"h": ("HalfStorage", "1", 6, 1, (5,), (1,)), "step": 7},  # nested dict; ints are skipped
        "empty": ("FloatStorage", "0", 24, 0, (0, 4), (4, 1)),
        "u16": ("UntypedStorage", "2", 8, 1, (3,), (1,), "uint16"),  # v3: byte storage, uint16 elements
    }
    path = tmp_path / "ckpt.pt"
    u16 = np.array([7, 65535, 3, 9], np.uint16)
    write_torch_zip(path, torch_state_pickle(state), {"0": base, "1": half, "2": u16}, compress)
    weights = load_weights([path])
    assert isinstance(weights, PytorchWeights)
    assert [n for n, _ in weights.items()] == ["a.weight", "a.bias", "a.t", "b.h", "empty", "u16"]
    np.testing.assert_array_equal(weights.a.weight.data().to_numpy(), base[:6].reshape(2, 3))
    np.testing.assert_array_equal(weights.a.bias.data().to_numpy(), base[6:10])
    np.testing.assert_array_equal(weights.a.t.data().to_numpy(), base[:6].reshape(2, 3).T)
    h = weights.b.h.data()
    assert h.dtype is DType.float16
    np.testing.assert_array_equal(h.to_numpy(), half[1:6])
    assert weights.empty.data().shape == [0, 4]
    assert weights.u16.dtype is DType.uint16
    np.testing.assert_array_equal(weights.u16.data().to_numpy(), u16[1:4])


def test_pytorch_tensor_outside_its_storage_is_rejected(tmp_path):
    path = tmp_path / "bad.bin"
    write_torch_zip(
        path, torch_state_pickle({"w": ("FloatStorage", "0", 4, 2, (4,), (1,))}), {"0": np.zeros(4, np.float32)}
    )
    with pytest.raises(ValueError, match=r"bad.bin.*'w'"):
        PytorchWeights(path)


def _malicious_bins(tmp_path, marker):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    via_pickle = tmp_path / "evil1.bin"  # pickle writes GLOBAL 'posix system'
    write_torch_zip(via_pickle, pickle.dumps({"w": Evil()}, protocol=2), {})
    by_hand = tmp_path / "evil2.bin"  # GLOBAL 'os system', then a call
    write_torch_zip(by_hand, b"\x80\x02cos\nsystem\n" + p_str(f"touch {marker}") + b"\x85R.", {})
    builtin_eval = tmp_path / "evil3.bin"
    write_torch_zip(builtin_eval, b"\x80\x02cbuiltins\neval\n" + p_str(f"open({str(marker)!r}, 'w')") + b"\x85R.", {})
    return [(via_pickle, r"posix\.system"), (by_hand, r"os\.system"), (builtin_eval, r"builtins\.eval")]


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    for path, global_name in _malicious_bins(tmp_path, marker):
        with pytest.raises(pickle.UnpicklingError, match=rf"{path.name}.*{global_name}"):
            PytorchWeights(path)
        with pytest.raises(pickle.UnpicklingError):
            load_weights([path])
    assert not marker.exists()


# -- GGUF -----------------------------------------------------------------------------

_HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
for _i in range(2):
    _HF_NAMES |= {
        f"blk.{_i}.attn_norm.weight": f"model.layers.{_i}.input_layernorm.weight",
        f"blk.{_i}.ffn_norm.weight": f"model.layers.{_i}.post_attention_layernorm.weight",
        **{
            f"blk.{_i}.attn_{g}.weight": f"model.layers.{_i}.self_attn.{h}_proj.weight"
            for g, h in [("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")]
        },
        **{f"blk.{_i}.ffn_{p}.weight": f"model.layers.{_i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
    }


def _unpermute_rows(w, gguf_name, metadata):
    """Undo llama.cpp's Q/K row permutation (see the fixtures README)."""
    if ".attn_q." in gguf_name:
        n_head = metadata["llama.attention.head_count"]
    elif ".attn_k." in gguf_name:
        n_head = metadata["llama.attention.head_count_kv"]
    else:
        return w
    out, k = w.shape
    head_dim = out // n_head
    return w.reshape(n_head, head_dim // 2, 2, k).swapaxes(1, 2).reshape(out, k)


def _check_block_error(deq, ref, levels, rounding):
    """Per 32-value block with step d = amax/levels: |error| <= rounding*d, plus the f16 rounding of d (2**-11
    relative).
    """
    amax = np.abs(ref.reshape(-1, 32)).max(axis=1, keepdims=True)
    step = amax / levels
    err = np.abs(deq - ref).reshape(-1, 32)
    bound = rounding * step + (amax + step) * 2.0**-11 + 1e-7
    assert np.all(err <= bound), float((err / bound).max())


@pytest.mark.parametrize("kind", ["q4_0", "q8_0"])
def test_gguf_names_shapes_and_encodings(kind):
    weights = GGUFWeights(LLAMA / f"tiny_llama-{kind}.gguf")
    reference = safetensors.numpy.load_file(LLAMA / "model.safetensors")
    assert sorted(n for n, _ in weights.items()) == sorted(_HF_NAMES)
    for name, hf in _HF_NAMES.items():
        ref = reference[hf]
        wd = weights[name].data()
        if ref.ndim == 1:  # norms are F32: exact
            assert wd.dtype is DType.float32 and wd.quantization_encoding is None
            np.testing.assert_array_equal(wd.to_numpy(), ref)
        elif kind == "q4_0":
            out, k = ref.shape
            assert wd.dtype is DType.uint8 and wd.quantization_encoding is QuantizationEncoding.Q4_0
            assert wd.shape == [out, k // 32 * 18]
        else:  # Q8_0 has no MAX encoding: float32 values in HF shape
            assert wd.dtype is DType.float32 and wd.quantization_encoding is None and wd.shape == list(ref.shape)
    assert weights.metadata["general.architecture"] == "llama"


def test_gguf_q4_0_dequantizes_to_the_safetensors_weights():
    weights = GGUFWeights(LLAMA / "tiny_llama-q4_0.gguf")
    reference = safetensors.numpy.load_file(LLAMA / "model.safetensors")
    meta = weights.metadata
    for name, hf in _HF_NAMES.items():
        if reference[hf].ndim != 2:
            continue
        packed = weights[name].data().to_numpy()
        deq = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q4_0)
        assert deq.shape == reference[hf].shape
        _check_block_error(
            _unpermute_rows(deq, name, meta), reference[hf], levels=8, rounding=1.0
        )  # Q4_0 clips +8d to 7d
        # allocate(dtype=float32) dequantizes with the same oracle.
        w = weights[name].allocate(dtype=DType.float32)
        assert w.dtype is DType.float32 and w.shape == list(reference[hf].shape) and w.quantization_encoding is None
        np.testing.assert_array_equal(weights.allocated_weights[name], deq)


def test_gguf_q8_0_values_and_packed_bytes():
    weights = GGUFWeights(LLAMA / "tiny_llama-q8_0.gguf")
    reference = safetensors.numpy.load_file(LLAMA / "model.safetensors")
    q = weights.blk[0].attn_q.weight
    raw = q.raw_tensor()
    assert raw.dtype == np.uint8 and raw.shape == (64, 64 // 32 * 34)
    np.testing.assert_array_equal(q.data().to_numpy(), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0))
    _check_block_error(
        _unpermute_rows(q.data().to_numpy(), "blk.0.attn_q.weight", weights.metadata),
        reference["model.layers.0.self_attn.q_proj.weight"],
        levels=127,
        rounding=0.5,
    )
    w = q.allocate(dtype=DType.uint8)
    assert (w.dtype, w.shape) == (DType.uint8, [64, 68])
    np.testing.assert_array_equal(weights.allocated_weights["blk.0.attn_q.weight"], raw)


def test_gguf_quantized_allocate():
    weights = GGUFWeights(LLAMA / "tiny_llama-q4_0.gguf")
    wq = weights.blk[1].ffn_down.weight
    w = wq.allocate(quantization_encoding=QuantizationEncoding.Q4_0, shape=[64, 128])
    assert (w.dtype, w.shape, w.quantization_encoding) == (DType.uint8, [64, 72], QuantizationEncoding.Q4_0)
    assert w.original_dtype_and_shape == (DType.float32, [64, 128])
    assert wq.allocate(dtype=DType.uint8, shape=[64, 72]).shape == [64, 72]
    with pytest.raises(ValueError, match="expected shape"):
        wq.allocate(shape=[128, 64])
    with pytest.raises(ValueError, match="int8"):
        wq.allocate(dtype=DType.int8)
    with pytest.raises(ValueError, match="unquantized"):
        weights.output_norm.weight.allocate(quantization_encoding=QuantizationEncoding.Q4_K)
    with pytest.raises(ValueError, match="Q4_0 blocks.*would not dequantize"):
        wq.data().astype(DType.float32)


# -- graph + session --------------------------------------------------------------------


def test_allocated_weights_feed_inference_session():
    pytest.importorskip("maxfx.driver", reason="needs maxfx.driver for InferenceSession")
    from maxfx.engine import InferenceSession
    from maxfx.graph import Graph, TensorType

    weights = load_weights([LLAMA / "model.safetensors"])
    with Graph("scale", input_types=[TensorType(DType.float32, ["batch", 64])]) as g:
        norm = weights.model.norm.weight.allocate(shape=[64])
        ln = weights.model.layers[0].input_layernorm.weight.allocate()
        g.output(g.inputs[0] * norm + ln)
    assert set(weights.allocated_weights) == {"model.norm.weight", "model.layers.0.input_layernorm.weight"}
    model = InferenceSession().load(g, weights_registry=weights.allocated_weights)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    reference = safetensors.numpy.load_file(LLAMA / "model.safetensors")
    want = x * reference["model.norm.weight"] + reference["model.layers.0.input_layernorm.weight"]
    np.testing.assert_allclose(model.execute(x)[0].to_numpy(), want, rtol=1e-6, atol=1e-6)


# -- bad files ------------------------------------------------------------------------


def _truncated_copy(src, dst, keep):
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: int(len(data) * keep)])
    return dst


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.002])
def test_truncated_safetensors(tmp_path, keep):
    path = _truncated_copy(LLAMA / "model.safetensors", tmp_path / "cut.safetensors", keep)
    with pytest.raises(ValueError, match="cut.safetensors"):
        SafetensorWeights([path])


def test_corrupt_safetensors_header(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(struct.pack("<Q", 10) + b"{not json}" + b"\0" * 16)
    with pytest.raises(ValueError, match=r"junk.safetensors.*JSON"):
        SafetensorWeights([path])
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(ValueError, match=r"junk.safetensors.*'w'.*needs 16"):
        SafetensorWeights([path])
    with pytest.raises(ValueError, match="not found"):
        SafetensorWeights([tmp_path / "missing.safetensors"])


@pytest.mark.parametrize("keep", [0.5, 0.99, 0.01])
def test_truncated_gguf(tmp_path, keep):
    path = _truncated_copy(LLAMA / "tiny_llama-q4_0.gguf", tmp_path / "cut.gguf", keep)
    with pytest.raises(ValueError, match="cut.gguf"):
        GGUFWeights(path)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(ValueError, match="fake.gguf"):
        load_weights([path])


@pytest.mark.parametrize("keep", [0.5, 0.9999, 0.05])
def test_truncated_pytorch_bin(tmp_path, keep):
    path = _truncated_copy(LLAMA / "pytorch_model.bin", tmp_path / "cut.bin", keep)
    with pytest.raises(ValueError, match="cut.bin"):
        PytorchWeights(path)


def test_corrupt_pickle_is_a_value_error(tmp_path):
    path = tmp_path / "garbage.bin"
    write_torch_zip(path, b"\x80\x02}(X\x05\x00\x00\x00abc", {})  # cut off mid-string
    with pytest.raises(ValueError, match=r"garbage.bin.*corrupt pickle"):
        PytorchWeights(path)
    write_torch_zip(path, b"\x80\x02]q\x00.", {})  # a list, not a state dict
    with pytest.raises(ValueError, match="not a state dict"):
        PytorchWeights(path)


def test_pytorch_missing_storage_entry(tmp_path):
    path = tmp_path / "nostore.bin"
    write_torch_zip(path, torch_state_pickle({"w": ("FloatStorage", "0", 4, 0, (4,), (1,))}), {})
    with pytest.raises(ValueError, match=r"nostore.bin.*data/0"):
        PytorchWeights(path)


# -- format detection, WeightData, progress ------------------------------------------


def test_weights_format_and_errors():
    assert weights_format([Path("a-00001.safetensors"), Path("a-00002.safetensors")]) is WeightsFormat.safetensors
    assert str(weights_format(["m.safetensors"])) == "WeightsFormat.safetensors"
    for ext in (".bin", ".pt", ".pth", ".PT"):
        assert weights_format([Path("m" + ext)]) is WeightsFormat.pytorch
    assert weights_format([Path("m.gguf")]) is WeightsFormat.gguf
    with pytest.raises(ValueError, match="no weight files"):
        weights_format([])
    with pytest.raises(ValueError, match="mix formats"):
        weights_format([Path("a.safetensors"), Path("b.bin")])
    with pytest.raises(ValueError, match=r"unknown extension '\.npz'"):
        weights_format([Path("a.npz")])
    assert [f.value for f in WeightsFormat] == ["gguf", "pytorch", "safetensors"]


def test_load_weights_dispatch():
    assert isinstance(load_weights([LLAMA / "model.safetensors"]), SafetensorWeights)
    assert isinstance(load_weights([LLAMA / "pytorch_model.bin"]), PytorchWeights)
    assert isinstance(load_weights([LLAMA / "tiny_llama-q4_0.gguf"]), GGUFWeights)
    with pytest.raises(ValueError, match="single files"):
        load_weights([LLAMA / "tiny_llama-q4_0.gguf", LLAMA / "tiny_llama-q8_0.gguf"])


def test_weight_data_conversion_and_dlpack():
    arr = np.array([[1.0, 2.5], [-3.25, 1e-3]], np.float32)
    wd = WeightData.from_numpy(arr, "w")
    assert (wd.name, wd.dtype, wd.shape, wd.quantization_encoding) == ("w", DType.float32, [2, 2], None)
    half = wd.astype(DType.float16)
    assert half.dtype is DType.float16 and half.to_numpy().dtype == np.float16
    assert not np.shares_memory(half.to_numpy(), arr)
    np.testing.assert_array_equal(half.to_numpy(), arr.astype(np.float16))
    bf = wd.astype(DType.bfloat16).to_numpy()
    np.testing.assert_array_equal(bf, arr.astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(np.from_dlpack(wd), arr)
    assert wd.__dlpack_device__() == arr.__dlpack_device__()
    import jax.numpy as jnp

    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(WeightData.from_numpy(arr.copy(), "w"))), arr)
    # Memory-mapped checkpoint tensors export too (copy-on-write maps are writable).
    st = SafetensorWeights([LLAMA / "model.safetensors"]).model.norm.weight.data()
    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(st)), st.to_numpy())


def test_materialize_reads_copies_with_progress(monkeypatch):
    weights = SafetensorWeights([LLAMA / "model.safetensors"])
    monkeypatch.setenv("MAXFX_PROGRESS_MIN_BYTES", "1")
    layer = weights.model.layers[0].materialize()
    assert len(layer) == 9 and all(k.startswith("model.layers.0.") for k in layer)
    for name, value in layer.items():
        np.testing.assert_array_equal(value, weights[name].data().to_numpy())
        assert not isinstance(value, np.memmap)
    monkeypatch.delenv("MAXFX_PROGRESS_MIN_BYTES")
    with progress_bar(1024, "small") as bar:
        assert bar.disable


def test_iterating_a_tree_is_an_error_not_a_hang():
    weights = SafetensorWeights([LLAMA / "model.safetensors"])
    with pytest.raises(TypeError, match="items"):
        list(weights)
    assert "lm_head.weight" in weights and "mlp.up_proj.weight" in weights.model.layers[0]
    assert "mlp.nope" not in weights.model.layers[0]


def test_reader_objects_are_not_modified(tmp_path):
    # Writing into a loaded array never reaches the file (copy-on-write maps).
    path = tmp_path / "m.safetensors"
    path.write_bytes((LLAMA / "model.safetensors").read_bytes())
    before = path.read_bytes()
    weights = SafetensorWeights([path])
    arr = weights.model.norm.weight.data().to_numpy()
    arr[:] = 0
    del weights, arr
    assert path.read_bytes() == before
