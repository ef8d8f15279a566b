"""``max.nn.float8_config``: how a model's float8 weights and activations are scaled.

A `Float8Config` pairs a `Float8InputScaleSpec` (activations: static scale
loaded with the weights, or dynamic per tensor/token/block) with a
`Float8WeightScaleSpec` (weights: per tensor, row, column or block), plus the
layer indices whose MLP / attention projections are float8.
`parse_float8_config` reads one from a Hugging Face config.

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.nn.float8_config import parse_float8_config
    >>> hf = {"num_hidden_layers": 2, "quantization_config": {
    ...     "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}
    >>> cfg = parse_float8_config(hf, {}, DType.float8_e4m3fn)
    >>> cfg.weight_scale.is_block, cfg.weight_scale.block_size, cfg.is_dynamic, sorted(cfg.mlp_in_float8)
    (True, (128, 128), True, [0, 1])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from lowering.dtypes import DType

__all__ = [
    "Float8Config",
    "Float8InputScaleSpec",
    "Float8ScaleGranularity",
    "Float8ScaleOrigin",
    "Float8WeightScaleSpec",
    "parse_float8_config",
]


class Float8ScaleGranularity(Enum):
    """What one scale factor covers: the whole tensor, a row, a column or a block."""

    TENSOR = "tensor"
    ROWWISE = "rowwise"
    COLWISE = "colwise"
    BLOCK = "block"

    def __str__(self) -> str:
        return self.value


class Float8ScaleOrigin(Enum):
    """Whether scales are loaded with the weights (static) or computed from the data (dynamic)."""

    STATIC = "static"
    DYNAMIC = "dynamic"


class _GranularityProps:
    granularity: Float8ScaleGranularity

    @property
    def is_tensor(self) -> bool:
        """One scale for the whole tensor."""
        return self.granularity is Float8ScaleGranularity.TENSOR

    @property
    def is_rowwise(self) -> bool:
        """One scale per row."""
        return self.granularity is Float8ScaleGranularity.ROWWISE

    @property
    def is_colwise(self) -> bool:
        """One scale per column (for activations: per token)."""
        return self.granularity is Float8ScaleGranularity.COLWISE

    @property
    def is_block(self) -> bool:
        """One scale per ``block_size`` block."""
        return self.granularity is Float8ScaleGranularity.BLOCK


def _check_block(owner: str, granularity: Float8ScaleGranularity, block_size: Any) -> tuple[int, int] | None:
    if block_size is None:
        if granularity is Float8ScaleGranularity.BLOCK:
            raise ValueError(f"{owner}: BLOCK granularity needs block_size=(rows, cols)")
        return None
    bs = tuple(int(b) for b in block_size)
    if len(bs) != 2 or min(bs) <= 0:
        raise ValueError(f"{owner}: block_size must be two positive ints, got {block_size!r}")
    return bs  # type: ignore[return-value]


@dataclass
class Float8WeightScaleSpec(_GranularityProps):
    """How float8 weights are scaled: ``granularity``, scale ``dtype``, ``block_size`` for BLOCK.

    Example:
        >>> Float8WeightScaleSpec(Float8ScaleGranularity.ROWWISE, DType.float32).is_rowwise
        True
    """

    granularity: Float8ScaleGranularity
    dtype: DType
    block_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.granularity = Float8ScaleGranularity(self.granularity)
        self.block_size = _check_block("Float8WeightScaleSpec", self.granularity, self.block_size)


@dataclass
class Float8InputScaleSpec(_GranularityProps):
    """How activations are scaled: granularity, static/dynamic ``origin``, scale dtype,
    an optional upper bound on dynamic scales and ``block_size`` for BLOCK.

    Example:
        >>> spec = Float8InputScaleSpec(Float8ScaleGranularity.COLWISE, Float8ScaleOrigin.DYNAMIC, DType.float32)
        >>> spec.is_colwise, spec.activation_scale_ub
        (True, None)
    """

    granularity: Float8ScaleGranularity
    origin: Float8ScaleOrigin
    dtype: DType
    activation_scale_ub: float | None = None
    block_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.granularity = Float8ScaleGranularity(self.granularity)
        self.origin = Float8ScaleOrigin(self.origin)
        self.block_size = _check_block("Float8InputScaleSpec", self.granularity, self.block_size)


@dataclass
class Float8Config:
    """float8 settings of a model: input/weight scale specs and which layers are float8.

    Example:
        >>> w = Float8WeightScaleSpec(Float8ScaleGranularity.TENSOR, DType.float32)
        >>> i = Float8InputScaleSpec(Float8ScaleGranularity.TENSOR, Float8ScaleOrigin.STATIC, DType.float32)
        >>> Float8Config(i, w, mlp_in_float8={0}, attn_qkv_in_float8=set()).is_static
        True
    """

    input_scale: Float8InputScaleSpec
    weight_scale: Float8WeightScaleSpec
    mlp_in_float8: set[int] = field(default_factory=set)
    attn_qkv_in_float8: set[int] = field(default_factory=set)
    embedding_output_dtype: DType | None = None
    quant_method: str | None = None

    @property
    def is_static(self) -> bool:
        """Input scales are loaded with the weights."""
        return self.input_scale.origin is Float8ScaleOrigin.STATIC

    @property
    def is_dynamic(self) -> bool:
        """Input scales are computed from each batch."""
        return self.input_scale.origin is Float8ScaleOrigin.DYNAMIC


# ─── parsing Hugging Face configs ─────────────────────────────────────────


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _dtype_of(value: Any) -> DType:
    dt = getattr(value, "dtype", None)
    if isinstance(dt, DType):
        return dt
    return DType.from_numpy(np.dtype(dt))


def _shape_of(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in getattr(value, "shape", ()))


def _layers_in_float8(hf: Any, ignored: set[str], prefix: str) -> tuple[set[int], set[int]]:
    """Layers whose MLP / attention projections are all float8 (none listed as ignored)."""
    mlp, attn = set(), set()
    for i in range(int(_get(hf, "num_hidden_layers", 0) or 0)):
        for names, out, what in (
            (["gate_proj", "up_proj", "down_proj"], mlp, f"layers.{i}.mlp"),
            (["q_proj", "k_proj", "v_proj", "o_proj"], attn, f"layers.{i}.self_attn"),
        ):
            skipped = [f"{prefix}{what}.{n}" in ignored for n in names]
            if not any(skipped):
                out.add(i)
            elif not all(skipped):
                raise ValueError(
                    f"parse_float8_config: {prefix}{what} mixes float8 and unquantized projections; float8 must be "
                    "uniform per block"
                )
    return mlp, attn


def _embedding_dtype(state_dict: Mapping[str, Any], ignored: set[str], prefix: str) -> DType:
    for name in (f"{prefix}embed_tokens.weight", f"{prefix}lm_head.weight"):
        if name in state_dict:
            return _dtype_of(state_dict[name])
    if f"{prefix}lm_head" in ignored:
        raise ValueError(
            "parse_float8_config: lm_head is not quantized but neither it nor embed_tokens is in the checkpoint; "
            "cannot tell the embedding dtype"
        )
    return DType.float8_e4m3fn


def _find_scale(state_dict: Mapping[str, Any], suffix: str) -> Any:
    return next((v for k, v in state_dict.items() if k.endswith(suffix)), None)


_CT_GRANULARITY = {
    "tensor": Float8ScaleGranularity.TENSOR,
    "channel": Float8ScaleGranularity.ROWWISE,
    "token": Float8ScaleGranularity.COLWISE,
    "block": Float8ScaleGranularity.BLOCK,
}


def _ct_granularity(strategy: str, what: str) -> Float8ScaleGranularity:
    try:
        return _CT_GRANULARITY[strategy]
    except KeyError:
        raise ValueError(
            f"parse_float8_config: unsupported compressed-tensors {what} strategy {strategy!r}; expected one of "
            f"{sorted(_CT_GRANULARITY)}"
        ) from None


def _parse_compressed_tensors(
    qc: Mapping[str, Any], state_dict: Mapping[str, Any], dtype: DType
) -> tuple[Float8InputScaleSpec, Float8WeightScaleSpec, set[str]]:
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ValueError("parse_float8_config: compressed-tensors config has no config_groups")
    group = groups.get("group_0") or next(iter(groups.values()))
    acts, weights = group.get("input_activations") or {}, group.get("weights") or {}
    if weights.get("dynamic"):
        raise ValueError("parse_float8_config: dynamic weight scales are not supported for compressed-tensors float8")
    in_scale = _find_scale(state_dict, "input_scale")
    w_scale = _find_scale(state_dict, "weight_scale")
    wblock = weights.get("block_structure")
    inputs = Float8InputScaleSpec(
        _ct_granularity(acts.get("strategy", "token"), "input"),
        Float8ScaleOrigin.DYNAMIC if acts.get("dynamic", True) else Float8ScaleOrigin.STATIC,
        _dtype_of(in_scale) if in_scale is not None else dtype,
        block_size=(1, wblock[1]) if acts.get("strategy") == "group" and wblock else None,
    )
    wspec = Float8WeightScaleSpec(
        _ct_granularity(weights.get("strategy", "channel"), "weight"),
        _dtype_of(w_scale) if w_scale is not None else DType.float32,
        block_size=tuple(wblock) if wblock else None,
    )
    return inputs, wspec, set(qc.get("ignore") or [])


def _parse_fbgemm(
    qc: Mapping[str, Any], state_dict: Mapping[str, Any], dtype: DType
) -> tuple[Float8InputScaleSpec, Float8WeightScaleSpec, set[str]]:
    scale_dtypes = {_dtype_of(v) for k, v in state_dict.items() if "weight_scale" in k}
    bad = [k for k, v in state_dict.items() if "weight_scale" in k and (len(_shape_of(v)) != 2 or _shape_of(v)[1] != 1)]
    if bad or len(scale_dtypes) > 1:
        raise ValueError(
            "parse_float8_config: fbgemm_fp8 needs row-wise [N, 1] weight scales of one dtype; offending: "
            f"{bad or sorted(d.name for d in scale_dtypes)}"
        )
    inputs = Float8InputScaleSpec(
        Float8ScaleGranularity.COLWISE,
        Float8ScaleOrigin.DYNAMIC,
        dtype,
        activation_scale_ub=qc.get("activation_scale_ub"),
    )
    wspec = Float8WeightScaleSpec(Float8ScaleGranularity.ROWWISE, scale_dtypes.pop() if scale_dtypes else DType.float32)
    return inputs, wspec, set(qc.get("modules_to_not_convert") or [])


def _parse_finegrained_fp8(
    qc: Mapping[str, Any], state_dict: Mapping[str, Any], dtype: DType
) -> tuple[Float8InputScaleSpec, Float8WeightScaleSpec, set[str]]:
    block = qc.get("weight_block_size")
    w_scale = _find_scale(state_dict, "weight_scale_inv")
    scale_dtype = _dtype_of(w_scale) if w_scale is not None else DType.float32
    wspec = Float8WeightScaleSpec(
        Float8ScaleGranularity.BLOCK if block else Float8ScaleGranularity.TENSOR,
        scale_dtype,
        block_size=tuple(block) if block else None,
    )
    if qc.get("activation_scheme", "dynamic") == "dynamic":
        gran = Float8ScaleGranularity.BLOCK if block else Float8ScaleGranularity.COLWISE
        inputs = Float8InputScaleSpec(
            gran, Float8ScaleOrigin.DYNAMIC, scale_dtype, block_size=(1, block[1]) if block else None
        )
    else:
        inputs = Float8InputScaleSpec(Float8ScaleGranularity.TENSOR, Float8ScaleOrigin.STATIC, scale_dtype)
    return inputs, wspec, set(qc.get("modules_to_not_convert") or [])


_PARSERS = {"compressed-tensors": _parse_compressed_tensors, "fbgemm_fp8": _parse_fbgemm, "fp8": _parse_finegrained_fp8}


def parse_float8_config(
    huggingface_config: Any,
    state_dict: Mapping[str, Any],
    dtype: DType,
    state_dict_name_prefix: str = "",
    ignored_modules_prefix: str = "model.",
) -> Float8Config | None:
    """The `Float8Config` of a Hugging Face model, or None when ``dtype`` is not float8_e4m3fn.

    ``huggingface_config`` is a transformers config or a plain dict with
    ``quantization_config`` and ``num_hidden_layers``; ``state_dict`` maps
    checkpoint names to weights (anything with ``dtype``/``shape``: `WeightData`,
    numpy arrays). Supported ``quant_method``\\ s: ``"compressed-tensors"``,
    ``"fbgemm_fp8"`` (dynamic per-token inputs, row-wise weights) and ``"fp8"``
    (Hugging Face fine-grained: ``weight_block_size`` block scales).

    Raises:
        ValueError: float8 ``dtype`` without a supported ``quantization_config``,
            or a layer whose projections are only partly float8.
    """
    if dtype is not DType.float8_e4m3fn:
        return None
    qc = _get(huggingface_config, "quantization_config")
    if not qc:
        raise ValueError(
            "parse_float8_config: dtype is float8_e4m3fn but the Hugging Face config has no quantization_config"
        )
    qc = dict(qc) if isinstance(qc, Mapping) else dict(vars(qc))
    method = qc.get("quant_method") or "compressed-tensors"
    if method not in _PARSERS:
        raise ValueError(
            f"parse_float8_config: unsupported float8 quant_method {method!r}; supported: {sorted(_PARSERS)}"
        )
    inputs, weights, ignored = _PARSERS[method](qc, state_dict, dtype)
    mlp, attn = _layers_in_float8(huggingface_config, ignored, ignored_modules_prefix)
    return Float8Config(
        input_scale=inputs,
        weight_scale=weights,
        mlp_in_float8=mlp,
        attn_qkv_in_float8=attn,
        embedding_output_dtype=_embedding_dtype(state_dict, ignored, state_dict_name_prefix),
        quant_method=method,
    )
