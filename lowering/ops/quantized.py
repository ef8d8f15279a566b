"""Quantized ops: ``dequantize`` and ``qmatmul`` over packed uint8 weights.

Encodings are `QuantizationEncoding` members (a member's value such as
``"Q4_K"`` is accepted too). The math lives in ``custom_calls.qmatmul`` (a
plain-jnp reference today, Pallas kernels behind the same functions later);
this module checks shapes and dtypes at the call site and binds the ops.

- GGUF (``Q4_0``, ``Q4_K``, ``Q5_K``, ``Q6_K``): a quantized matrix is
  ``uint8 [rows, row_bytes]``, each row a run of blocks (Q4_0: 32 elements in
  18 bytes; K-quants: 256 in 144/176/210). ``dequantize`` gives float32
  ``[..., row_bytes / block_size * elements_per_block]``, bit-identical to
  ``gguf.quants.dequantize``. MAX documents Q4_0/Q4_K/Q6_K; Q5_K is an extension.
- GPTQ int4 (only in ``qmatmul``, configured by a `QuantizationConfig` with
  ``quant_method="gptq"``, ``bits=4``, ``sym=True``): the rhs is MAX's packed
  ``uint8 [K/2 + 2*K/group_size, N]`` (raw ``qweight`` bytes then raw f16
  ``scales`` bytes, see ``custom_calls.qmatmul.gptq_pack``), plus ``perm_idx
  [K]`` when ``desc_act`` (the lhs is then already gathered by ``perm_idx``).

``qmatmul`` returns ``lhs @ dequantize(rhs).T`` (GGUF, rhs transposed) or
``lhs @ W`` (GPTQ) in the lhs dtype with float32 accumulation. MAX's kernels
also quantize the activations; maxfx does not, so results differ from MAX's by
MAX's own quantization error (~1e-2 relative) and are closer to the exact product.
"""

from __future__ import annotations

from typing import Any

from custom_calls import qmatmul as cq
from lowering.context import bind
from lowering.dims import StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.quantization import QuantizationEncoding
from lowering.registry import OpDef, OpError, front, register
from lowering.types import TensorType

__all__ = ["dequantize", "qmatmul", "q8_0_matmul", "q8_0_matmul_p", "QuantizedInputError"]


class QuantizedInputError(OpError, TypeError):
    """A quantized op got an operand of the wrong dtype or rank.

    MAX raises TypeError for these; maxfx op errors are ValueErrors. This class is
    both, so either ``except`` clause catches it.
    """


def _as_encoding(op: str, encoding: Any) -> QuantizationEncoding:
    if isinstance(encoding, QuantizationEncoding):
        return encoding
    if isinstance(encoding, str):
        for member in QuantizationEncoding:
            if encoding.upper() in (member.value, f"QUANTIZATIONENCODING.{member.value}"):
                return member
    supported = ", ".join(m.value for m in QuantizationEncoding)
    raise OpError(
        f"{op}: unsupported quantization encoding {encoding!r}; expected a QuantizationEncoding ({supported})"
    )


def _gguf_block(op: str, enc: QuantizationEncoding) -> tuple[int, int]:
    if enc.value not in cq.GGUF_BLOCKS:
        raise OpError(f"{op}: unsupported quantization encoding {enc}")
    return cq.block_shape(enc.value)


def _quantized_matrix(op: str, enc: QuantizationEncoding, t: Any, name: str) -> TensorType:
    t = R.require_tensor(op, t, name)
    if t.dtype is not DType.uint8:
        raise QuantizedInputError(f"{op}: {name} must be uint8 bytes packed as {enc}, got {R.fmt(t)}")
    return t


# ─── dequantize ───────────────────────────────────────────────────────────


def _dequantize_rule(quantized, *, encoding: QuantizationEncoding) -> TensorType:
    op = "dequantize"
    if encoding is QuantizationEncoding.GPTQ:
        raise OpError(
            f"{op}: {encoding} weights have no standalone block layout (their packing depends on a "
            "QuantizationConfig); use ops.qmatmul(encoding, config, x, weight) instead"
        )
    elems, nbytes = _gguf_block(op, encoding)
    q = _quantized_matrix(op, encoding, quantized, "quantized")
    R.require_rank(op, q, lambda r: r >= 1, ">= 1 (rows of packed blocks)", "quantized")
    last = q.shape[-1]
    if not isinstance(last, StaticDim):
        raise QuantizedInputError(
            f"{op}: dequantize only supported with static last dimension; {R.fmt(q)} has a symbolic one ({encoding})"
        )
    if last.dim % nbytes:
        raise OpError(
            f"{op}: last dimension ({last.dim}) not divisible by block size ({nbytes}) of {encoding}: {R.fmt(q)} must "
            f"hold whole {nbytes}-byte blocks"
        )
    return TensorType(DType.float32, list(q.shape[:-1]) + [last.dim // nbytes * elems], q.device)


dequantize_p = register(
    OpDef(
        "dequantize",
        rule=_dequantize_rule,
        impl=lambda q, *, encoding: cq.dequantize(encoding.value, q),
        differentiable=False,
    )
)


@front(dequantize_p)
def dequantize(encoding, quantized):
    """Decode packed GGUF blocks to float32 (bit-identical to ``gguf.quants.dequantize``).

    Args:
        encoding: ``QuantizationEncoding.Q4_0``, ``Q4_K``, ``Q5_K`` or ``Q6_K``.
        quantized: uint8 ``[..., row_bytes]``; ``row_bytes`` must be a static
            multiple of ``encoding.block_size``.

    Returns:
        float32 ``[..., row_bytes / block_size * elements_per_block]``.

    Raises:
        ValueError: unsupported encoding (including GPTQ), or a byte width that is
            not a whole number of blocks.
        TypeError: ``quantized`` is not uint8 or its last dim is symbolic (the
            error is also a ValueError).

    Example:
        >>> import numpy as np
        >>> import gguf
        >>> from maxfx.graph import ops
        >>> from maxfx.graph.quantization import QuantizationEncoding
        >>> from maxfx.tensor import Tensor
        >>> w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
        >>> packed = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)  # 32 values -> 18 bytes
        >>> packed.shape, packed.dtype
        ((4, 36), dtype('uint8'))
        >>> deq = ops.dequantize(QuantizationEncoding.Q4_0, Tensor(packed))
        >>> deq.shape
        [Dim(4), Dim(64)]
        >>> np.array_equal(np.asarray(deq), gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q4_0))
        True
    """
    enc = _as_encoding("dequantize", encoding)
    return bind(dequantize_p, quantized, encoding=enc)


# ─── qmatmul ──────────────────────────────────────────────────────────────


def _qmatmul_rule(
    lhs, *rhs, encoding: QuantizationEncoding, group_size: int | None = None, desc_act: bool = False
) -> TensorType:
    op = "qmatmul"
    lhs = R.require_tensor(op, lhs, "lhs")
    if not lhs.dtype.is_float():
        raise QuantizedInputError(f"{op}: lhs must be a float tensor, got {R.fmt(lhs)}")
    R.require_rank(op, lhs, lambda r: r >= 1, ">= 1", "lhs")
    if not rhs:
        raise OpError(f"{op}: missing the quantized rhs")
    w = _quantized_matrix(op, encoding, rhs[0], "rhs")
    shapes = f"lhs {R.fmt(lhs)}, rhs {R.fmt(w)}"
    if w.rank != 2:
        raise QuantizedInputError(f"{op}: rhs packed as {encoding} must be a rank-2 matrix, got {shapes}")
    width = w.shape[1] if encoding.is_gguf else w.shape[0]
    if not isinstance(width, StaticDim):
        raise OpError(f"{op}: the packed byte dim of rhs must be static for {encoding}, got {shapes}")
    if encoding.is_gguf:
        _gguf_block(op, encoding)
        if len(rhs) != 1:
            raise OpError(f"{op}: {encoding} takes one quantized rhs, got {len(rhs)} tensors")
        # As in MAX, the result is [..., N] whatever the byte width; whether the
        # blocks match lhs's K is checked when the graph compiles (_check_gguf_k).
        device = R.input_device(lhs, *rhs)
        return TensorType(lhs.dtype, list(lhs.shape[:-1]) + [w.shape[0]], device)
    else:
        try:
            k = cq.gptq_packed_k(width.dim, group_size)
        except ValueError as e:
            raise OpError(f"{op}: {encoding}: {e} ({shapes}; rhs is [K/2 + 2*K/group_size, N])") from None
        n = w.shape[1]
        expected = 2 if desc_act else 1
        if len(rhs) != expected:
            what = "the packed weight and perm_idx" if desc_act else "only the packed weight (desc_act=False)"
            raise OpError(f"{op}: {encoding} with desc_act={desc_act} takes {what}, got {len(rhs)} rhs tensors")
        if desc_act:
            perm = R.require_tensor(op, rhs[1], "perm_idx")
            if not perm.dtype.is_integral() or perm.rank != 1 or perm.shape[0] != k:
                raise OpError(f"{op}: perm_idx must be an int tensor [{k}], got {R.fmt(perm)}")
    if lhs.shape[-1] != k:
        raise OpError(f"{op}: lhs last dim {lhs.shape[-1]} must equal K = {k} of the {encoding} rhs: {shapes}")
    device = R.input_device(lhs, *rhs)
    return TensorType(lhs.dtype, list(lhs.shape[:-1]) + [n], device)


def _check_gguf_k(encoding: QuantizationEncoding, lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...]) -> None:
    """The packed rhs ``[N, K / elems * nbytes]`` must hold whole blocks of lhs's K."""
    op = "qmatmul"
    elems, nbytes = _gguf_block(op, encoding)
    shapes = f"lhs float{list(lhs_shape)}, rhs uint8{list(rhs_shape)}"
    width = rhs_shape[1]
    if width % nbytes:
        raise OpError(
            f"{op}: rhs row width {width} bytes is not a multiple of the {encoding} block size ({nbytes} bytes): "
            f"{shapes} (rhs is transposed: [N, K / {elems} * {nbytes}])"
        )
    k = width // nbytes * elems
    if lhs_shape[-1] != k:
        raise OpError(f"{op}: lhs last dim {lhs_shape[-1]} must equal K = {k} of the {encoding} rhs: {shapes}")


def _qmatmul_impl(lhs, *rhs, encoding: QuantizationEncoding, group_size: int | None = None, desc_act: bool = False):
    if encoding.is_gguf:
        _check_gguf_k(encoding, tuple(lhs.shape), tuple(rhs[0].shape))
        return cq.qmatmul(encoding.value, lhs, rhs[0])
    return cq.gptq_qmatmul(lhs, rhs[0], rhs[1] if desc_act else None, group_size=group_size)


qmatmul_p = register(OpDef("qmatmul", rule=_qmatmul_rule, impl=_qmatmul_impl))


# ─── q8_0_matmul (GGUF Q8_0 held split; no MAX front) ─────────────────────
# MAX's QuantizationEncoding has no Q8_0, so maxfx keeps Q8_0 weights as int8
# values plus float16 scales (`maxfx.nn._q8`); their product is this op, so a
# backend with a kernel for it (the CPU one of `custom_calls/cpu/qgemv.cc`) reads
# the 8-bit values in place instead of a decoded float copy.


def _q8_0_matmul_rule(lhs, values, scales) -> TensorType:
    op = "q8_0_matmul"
    lhs, q, d = (
        R.require_tensor(op, lhs, "lhs"),
        R.require_tensor(op, values, "values"),
        R.require_tensor(op, scales, "scales"),
    )
    shapes = f"lhs {R.fmt(lhs)}, values {R.fmt(q)}, scales {R.fmt(d)}"
    if not lhs.dtype.is_float() or q.dtype is not DType.int8 or d.dtype is not DType.float16:
        raise QuantizedInputError(f"{op}: expected float lhs, int8 values and float16 scales, got {shapes}")
    if lhs.rank < 1 or q.rank != 2 or d.rank != 2:
        raise QuantizedInputError(f"{op}: expected lhs [..., K], values [N, K] and scales [N, K / 32], got {shapes}")
    if lhs.shape[-1] != q.shape[1] or d.shape[0] != q.shape[0] or q.shape[1] != d.shape[1] * 32:
        raise OpError(f"{op}: lhs [..., K], values [N, K] and scales [N, K / 32] do not agree: {shapes}")
    return TensorType(lhs.dtype, list(lhs.shape[:-1]) + [q.shape[0]], R.input_device(lhs, values, scales))


q8_0_matmul_p = register(OpDef("q8_0_matmul", rule=_q8_0_matmul_rule, impl=cq.q8_0_matmul))


@front(q8_0_matmul_p)
def q8_0_matmul(lhs, values, scales):
    """``lhs @ W.T`` for a GGUF Q8_0 ``W [N, K]`` held split (a maxfx extension: MAX has no Q8_0 encoding).

    On a CPU a float32 ``lhs`` runs maxfx's kernel, which rounds it to int16 per
    32 values first (at most 2^-16 of each block's largest value; see
    docs/pages/kernels.md); ``MAXFX_CPU_KERNELS=0`` keeps float products.

    Args:
        lhs: float ``[..., K]``.
        values: int8 ``[N, K]``, the quants.
        scales: float16 ``[N, K / 32]``, one per block of 32.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> q, d = np.ones((2, 32), np.int8), np.full((2, 1), 0.5, np.float16)
        >>> ops.q8_0_matmul(Tensor(np.ones((1, 32), np.float32)), Tensor(q), Tensor(d)).to_numpy().tolist()
        [[16.0, 16.0]]
    """
    return bind(q8_0_matmul_p, lhs, values, scales)


def _gptq_params(config: Any) -> tuple[int, bool]:
    if config is None:
        raise OpError("qmatmul: GPTQ needs a QuantizationConfig(quant_method='gptq', bits=4, group_size=..., sym=True)")
    fields = {k: getattr(config, k, None) for k in ("quant_method", "bits", "group_size", "desc_act", "sym")}
    if str(fields["quant_method"]).lower() != "gptq" or fields["bits"] != 4:
        raise OpError(f"qmatmul: unsupported GPTQ config {config!r}; only quant_method='gptq' with bits=4 is supported")
    if not fields["sym"]:
        raise OpError(
            f"qmatmul: unsupported GPTQ config {config!r}: sym=False needs zero points, which the packed GPTQ weight "
            "does not carry; only symmetric (sym=True) GPTQ is supported"
        )
    gs = fields["group_size"]
    if isinstance(gs, bool) or not isinstance(gs, int) or gs <= 0:
        raise OpError(f"qmatmul: GPTQ group_size must be a positive int, got {gs!r}")
    return gs, bool(fields["desc_act"])


@front(qmatmul_p)
def qmatmul(encoding, config, lhs, *rhs):
    """Matmul of a float lhs with a quantized, TRANSPOSED rhs: ``lhs @ dequantize(rhs).T``.

    Leading dims of ``lhs`` broadcast: ``[..., K]`` with a GGUF rhs
    ``uint8 [N, K / elements_per_block * block_size]`` gives ``[..., N]``.
    For GPTQ (``config`` required) the rhs is the packed ``uint8
    [K/2 + 2*K/group_size, N]`` weight, followed by ``perm_idx [K]`` when
    ``config.desc_act`` (``lhs`` must then already be gathered by ``perm_idx``).
    The result has the lhs dtype, accumulated in float32. On a CPU, Q4_0 with a
    float32 ``lhs`` runs maxfx's kernel, which rounds ``lhs`` to int16 per 32
    values first (docs/pages/kernels.md; ``MAXFX_CPU_KERNELS=0``: float products).

    Args:
        encoding: a `QuantizationEncoding` (Q4_0, Q4_K, Q5_K, Q6_K or GPTQ).
        config: `QuantizationConfig` for GPTQ; ignored (None) for GGUF.
        lhs: float ``[..., K]``.
        *rhs: the quantized weight (and ``perm_idx`` for act-order GPTQ).

    Raises:
        ValueError: unsupported encoding/config, a byte width that is not a whole
            number of blocks, or K differing from ``lhs``'s last dim. As in MAX, a
            graph with a GGUF rhs builds whatever its byte width (the result is
            ``[..., N]``); those two GGUF checks run when the graph compiles (and
            when an eager tensor is computed).
        TypeError: rhs not a uint8 matrix or lhs not float (also a ValueError).

    Example:
        >>> import numpy as np
        >>> import gguf
        >>> from maxfx.graph import ops
        >>> from maxfx.graph.quantization import QuantizationEncoding
        >>> from maxfx.tensor import Tensor
        >>> rng = np.random.default_rng(0)
        >>> w = rng.standard_normal((8, 256)).astype(np.float32)  # [N, K]
        >>> packed = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)  # uint8 [8, 256 / 32 * 18]
        >>> x = rng.standard_normal((2, 256)).astype(np.float32)
        >>> y = ops.qmatmul(QuantizationEncoding.Q4_0, None, Tensor(x), Tensor(packed))
        >>> y.shape
        [Dim(2), Dim(8)]
        >>> want = x @ gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q4_0).T
        >>> np.allclose(np.asarray(y), want, rtol=1e-4, atol=1e-4)
        True
    """
    enc = _as_encoding("qmatmul", encoding)
    if enc is QuantizationEncoding.GPTQ:
        group_size, desc_act = _gptq_params(config)
        return bind(qmatmul_p, lhs, *rhs, encoding=enc, group_size=group_size, desc_act=desc_act)
    _gguf_block("qmatmul", enc)
    return bind(qmatmul_p, lhs, *rhs, encoding=enc)
