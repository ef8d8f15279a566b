"""Rotary position embeddings (``max.nn.rotary_embedding``).

A RoPE layer builds a table ``freqs_cis_base()`` of shape ``(L, rope_dim // 2, 2)``
holding ``[cos(p * inv_freq[i]), sin(p * inv_freq[i])]`` for every position
``p < L`` (``L = max_seq_len * 2`` unless a subclass says otherwise);
``freqs_cis`` is the same data as ``(L, rope_dim)`` (pairs interleaved), the
layout the fused attention kernels read. The variants differ only in how
``inv_freq`` (and a magnitude scale) are computed, following the Hugging Face
``rope_type`` formulas: default, llama3, linear, dynamic NTK, yarn, longrope,
and DeepSeek's yarn.

Calling a layer rotates a ``[batch, seq, heads, head_dim]`` value:
``interleaved=True`` rotates pairs ``(2i, 2i+1)`` (GPT-J/Meta layout),
``interleaved=False`` rotates the halves ``(i, i + head_dim/2)`` (Hugging
Face's ``rotate_half`` layout).

Example:
    >>> from maxfx.nn import RotaryEmbedding
    >>> rope = RotaryEmbedding(dim=64, n_heads=4, theta=10000.0, max_seq_len=128)
    >>> rope.head_dim, rope.compute_scale()
    (16, 0.25)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.dims import format_shape
from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx._rope_math import apply_rope, default_inv_freq, rope_cos_sin, rotate_by_table
from maxfx.graph import Dim, Graph, ops
from maxfx.nn._graph_util import as_value as _as_value
from maxfx.nn._layer import Module

__all__ = [
    "RotaryEmbedding",
    "DynamicRotaryEmbedding",
    "Llama3RopeScalingParams",
    "Llama3RotaryEmbedding",
    "LinearScalingParams",
    "YarnScalingParams",
    "YarnRotaryEmbedding",
    "DeepseekYarnRopeScalingParams",
    "DeepseekYarnRotaryEmbedding",
    "LongRoPEScalingParams",
    "LongRoPERotaryEmbedding",
    # the math the layers above and maxfx.models share
    "apply_rope",
    "default_inv_freq",
    "rope_cos_sin",
    "scaled_inv_freq",
]

_CPU = DeviceRef.CPU()


# ─── scaling parameter records ────────────────────────────────────────────


@dataclass
class Llama3RopeScalingParams:
    """Llama-3.1 ``rope_scaling`` (HF ``rope_type="llama3"``)."""

    factor: float
    """Main scaling factor for the frequency components of the rope."""
    low_freq_factor: float
    """Factor to scale the low frequency components of the rope."""
    high_freq_factor: float
    """Factor to scale the high frequency components of the rope."""
    orig_max_position: int
    """The original maximum position length supported by the model."""


@dataclass
class LinearScalingParams:
    """Linear position interpolation (HF ``rope_type="linear"``): ``inv_freq / factor``."""

    factor: float
    """Main scaling factor for the frequency components of the rope."""


@dataclass
class YarnScalingParams:
    """YaRN parameters (HF ``rope_type="yarn"``)."""

    factor: float
    """Main scaling factor for the frequency components of the rope."""
    beta_fast: float
    """Yarn parameter for fast frequencies."""
    beta_slow: float
    """Yarn parameter for slow frequencies."""
    original_max_position_embeddings: int
    """The original maximum position length supported by the model."""
    truncate: bool
    """Whether to truncate the frequencies or not."""


@dataclass
class DeepseekYarnRopeScalingParams:
    """DeepSeek-V2/V3 YaRN parameters."""

    scaling_factor: float
    """Scaling factor for frequency interpolation."""
    original_max_position_embeddings: int
    """Original maximum sequence length during training."""
    beta_fast: int
    """Fast interpolation rate."""
    beta_slow: int
    """Slow interpolation rate."""
    mscale: float
    """Scaling factor for middle frequencies."""
    mscale_all_dim: float
    """Scaling factor applied to all dimensions."""


@dataclass
class LongRoPEScalingParams:
    """Parameters for LongRoPE scaling as used in Phi-3.5 models."""

    short_factor: list[float]
    """Scaling factors for short sequences (typically close to 1.0)."""
    long_factor: list[float]
    """Scaling factors for long sequences (can be much larger)."""
    original_max_position: int
    """Original max position embeddings the model was trained with."""
    max_position_embeddings: int
    """Current max position embeddings after scaling."""


# ─── helpers ──────────────────────────────────────────────────────────────


def _positive_int(layer: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")
    return int(value)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 when ``scale <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_dim(rotations: float, dim: int, base: float, max_pos: int) -> float:
    # The dimension index whose wavelength fits `rotations` times into max_pos.
    return dim * math.log(max_pos / (rotations * 2 * math.pi)) / (2 * math.log(base))


def _yarn_ramp(beta_fast: float, beta_slow: float, dim: int, base: float, max_pos: int, truncate: bool) -> Any:
    """``1 - ramp``: 1 where frequencies are kept (extrapolated), 0 where interpolated; ``[dim // 2]``."""
    low = _yarn_correction_dim(beta_fast, dim, base, max_pos)
    high = _yarn_correction_dim(beta_slow, dim, base, max_pos)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a division by zero (a step instead of a ramp)
    idx = ops.range(0, dim // 2, dtype=DType.float32, device=_CPU)
    ramp = ops.min(ops.max((idx - float(low)) / float(high - low), 0.0), 1.0)
    return 1.0 - ramp


def _yarn_interpolate(inv_freq: Any, params: Any, factor: float, dim: int, base: float, truncate: bool) -> Any:
    """Blend ``inv_freq`` (extrapolated) with ``inv_freq / factor`` (interpolated) along the YaRN ramp.

    ``params`` is a `YarnScalingParams` or `DeepseekYarnRopeScalingParams` (their betas and original context).
    """
    keep = _yarn_ramp(params.beta_fast, params.beta_slow, dim, base, params.original_max_position_embeddings, truncate)
    return (inv_freq / float(factor)) * (1.0 - keep) + inv_freq * keep


def _inv_freqs(theta: float, rope_dim: int) -> Any:
    """``[rope_dim // 2]`` float32 ``theta ** (-2i / rope_dim)`` (exponent in float64, as MAX does)."""
    iota = ops.range(0, rope_dim, 2, dtype=DType.float64, device=_CPU)
    return ops.cast(1.0 / (theta ** (iota / float(rope_dim))), DType.float32)


def _positions(start: int, stop: int) -> Any:
    return ops.range(start, stop, dtype=DType.float32, device=_CPU)


def _cos_sin(positions: Any, inv_freq: Any, scale: float = 1.0) -> Any:
    """``(len(positions), len(inv_freq), 2)`` table of ``[cos, sin] * scale``."""
    cos, sin = rope_cos_sin(positions, inv_freq)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return ops.stack([cos, sin], axis=-1)


# ─── base layer ───────────────────────────────────────────────────────────


class RotaryEmbedding(Module):
    """RotaryEmbedding layer to calculate and apply the frequency tensor for complex exponentials.

    ``inv_freq[i] = theta ** (-2i / head_dim)``; ``head_dim`` defaults to
    ``dim // n_heads``. ``freqs_cis_base()`` is ``(max_seq_len * 2, head_dim // 2, 2)``.

    Example:
        >>> rope = RotaryEmbedding(64, 4, 10000.0, 128, interleaved=False)
        >>> with Graph("r", input_types=[TensorType(DType.float32, [1, 8, 4, 16])]) as g:  # doctest: +SKIP
        ...     g.output(rope(g.inputs[0].tensor, start_pos=3))
    """

    dim: int
    n_heads: int
    theta: float
    max_seq_len: int
    head_dim: int
    interleaved: bool = True

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.dim = _positive_int(name, "dim", dim)
        self.n_heads = _positive_int(name, "n_heads", n_heads)
        self.theta = float(theta)
        if not self.theta > 1.0:
            raise ValueError(f"{name}: theta must be > 1, got {theta!r}")
        self.max_seq_len = _positive_int(name, "max_seq_len", max_seq_len)
        head_dim = head_dim if head_dim is not None else self._default_head_dim(dim, n_heads)
        self.head_dim = _positive_int(name, "head_dim", head_dim)
        if self.head_dim % 2:
            raise ValueError(f"{name}: head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        self.interleaved = bool(interleaved)
        self._freqs_cis = _freqs_cis
        self._cache: tuple[Any, Any] | None = None

    @staticmethod
    def _default_head_dim(dim: int, n_heads: int) -> int:
        return dim // n_heads

    # -- frequencies ---------------------------------------------------------
    @property
    def _rope_dim(self) -> int:
        """Width of the rotated part of a head (the table's second dim times 2)."""
        return self.head_dim

    def _table_len(self) -> int:
        return self.max_seq_len * 2

    def _compute_inv_freqs(self) -> Any:
        """``[rope_dim // 2]`` float32 ``theta ** (-2i / rope_dim)``."""
        return _inv_freqs(self.theta, self._rope_dim)

    def _table_scale(self) -> float:
        """Magnitude applied to cos and sin (YaRN variants scale the table)."""
        return 1.0

    def _build_table(self) -> Any:
        return _cos_sin(_positions(0, self._table_len()), self._compute_inv_freqs(), self._table_scale())

    def freqs_cis_base(self) -> Any:
        """Computes the frequency tensor for complex exponentials (cis) for a given seq_len.

        Returns:
            ``(max_seq_len * 2, head_dim // 2, 2)`` float32 ``[cos, sin]`` pairs
            (built once per Graph and reused).
        """
        graph = Graph.current
        if self._cache is not None and self._cache[0] is graph:
            return self._cache[1]
        if self._freqs_cis is not None:
            table = _as_value(self._freqs_cis)
            if table.rank == 2:
                table = ops.reshape(table, [table.shape[0], int(table.shape[1]) // 2, 2])
        else:
            table = self._build_table()
        self._cache = (graph, table)
        return table

    @property
    def freqs_cis(self) -> Any:
        """`freqs_cis_base` reshaped to ``(L, rope_dim)`` (cos/sin pairs interleaved), as the fused kernels read it."""
        base = self.freqs_cis_base()
        return ops.reshape(base, [base.shape[0], int(base.shape[1]) * 2])

    def compute_scale(self, user_scale: float | None = None) -> float:
        """Attention scale: ``user_scale`` when given, else ``1 / sqrt(head_dim)``."""
        return user_scale if user_scale is not None else math.sqrt(1.0 / self.head_dim)

    # -- application ---------------------------------------------------------
    def _check_input(self, v: Any) -> None:
        name = type(self).__name__
        if v.rank != 4:
            raise ValueError(
                f"{name}: expected a [batch, seq_len, n_heads, head_dim] value, got rank {v.rank} shape "
                f"{format_shape(v.shape)}"
            )
        if str(v.shape[-1]) != str(self._rope_dim):
            raise ValueError(
                f"{name}: the last dim of the input {format_shape(v.shape)} must be head_dim={self._rope_dim}"
            )
        if not v.dtype.is_float():
            raise ValueError(f"{name}: expected a floating-point input, got {v.dtype}")

    def __call__(self, x: Any, start_pos: Any = None, seq_len: Any = None) -> Any:
        """Rotate ``x`` (``[batch, seq_len, n_heads, head_dim]``) by the angles of positions ``start_pos ...``.

        Args:
            x: activations; the result has the same shape and dtype.
            start_pos: position of ``x[:, 0]`` (int or Dim; default 0).
            seq_len: number of positions (default ``x.shape[1]``).
        """
        v = _as_value(x)
        self._check_input(v)
        start = Dim(0) if start_pos is None else Dim(start_pos)
        length = v.shape[1] if seq_len is None else Dim(seq_len)
        table = self.freqs_cis_base()
        table = table.to(v.device) if table.device != v.device else table
        # float32 arithmetic, cast back to v.dtype (apply_rope)
        return rotate_by_table(v, table, start, length, interleaved=self.interleaved)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dim={self.dim}, n_heads={self.n_heads}, theta={self.theta}, "
            f"max_seq_len={self.max_seq_len}, head_dim={self.head_dim}, interleaved={self.interleaved})"
        )


class _ScaledRotaryEmbedding(RotaryEmbedding):
    """The scaled variants' constructor: `RotaryEmbedding`'s arguments and ``scaling_params``, checked by
    ``_check_params``.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
        scaling_params: Any = None,
    ) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, head_dim, _freqs_cis, interleaved)
        self._check_params(scaling_params)
        self.scaling_params = scaling_params

    def _check_params(self, scaling_params: Any) -> None:
        """Raise unless ``scaling_params`` suits this variant (any value by default)."""


# ─── Llama 3 / linear ─────────────────────────────────────────────────────


class Llama3RotaryEmbedding(_ScaledRotaryEmbedding):
    """RotaryEmbedding for Llama3 that takes rope scaling into account.

    With `Llama3RopeScalingParams` the frequencies follow HF's
    ``_compute_llama3_parameters``: wavelengths longer than
    ``orig_max_position / low_freq_factor`` are divided by ``factor``, shorter
    than ``orig_max_position / high_freq_factor`` are kept, and the band in
    between is blended smoothly. A `LinearScalingParams` divides every
    frequency by its ``factor``. ``scaling_params=None`` is plain RoPE.

    Example:
        >>> params = Llama3RopeScalingParams(8.0, 1.0, 4.0, 8192)
        >>> rope = Llama3RotaryEmbedding(4096, 32, 500000.0, 2048, scaling_params=params)
    """

    scaling_params: Llama3RopeScalingParams | None = None

    def _check_params(self, scaling_params: Any) -> None:
        if scaling_params is not None and not isinstance(
            scaling_params, (Llama3RopeScalingParams, LinearScalingParams)
        ):
            raise TypeError(
                "Llama3RotaryEmbedding: scaling_params must be Llama3RopeScalingParams or LinearScalingParams, got "
                f"{type(scaling_params).__name__}"
            )

    def _compute_inv_freqs(self) -> Any:
        if self.scaling_params is None:
            return super()._compute_inv_freqs()
        inv = scaled_inv_freq(default_inv_freq(self.theta, self._rope_dim), self.scaling_params)
        return ops.constant(inv.astype(np.float32), DType.float32, _CPU)


def scaled_inv_freq(inv: np.ndarray, params: Llama3RopeScalingParams | LinearScalingParams) -> np.ndarray:
    """``inv`` (float64) with Llama 3 or linear scaling applied, as Hugging Face computes it.

    The one copy of the formula: `Llama3RotaryEmbedding` builds its table from
    it and `maxfx.models.LlamaConfig.inv_freq` returns it, so the graph and the
    eager Llama rotate by the same frequencies. Llama 3: wavelengths longer than
    ``orig_max_position / low_freq_factor`` are divided by ``factor``, shorter
    than ``orig_max_position / high_freq_factor`` kept, the band between blended.

    Example:
        >>> p = Llama3RopeScalingParams(8.0, 1.0, 4.0, 64)
        >>> scaled_inv_freq(default_inv_freq(10000.0, 16), p).shape
        (8,)
    """
    inv = np.asarray(inv, np.float64)
    if isinstance(params, LinearScalingParams):
        return inv / float(params.factor)
    factor, lo, hi, old = (
        float(params.factor),
        float(params.low_freq_factor),
        float(params.high_freq_factor),
        float(params.orig_max_position),
    )
    wavelen = 2 * math.pi / inv
    smooth = (old / wavelen - lo) / (hi - lo) if hi != lo else np.zeros_like(inv)
    blended = (1.0 - smooth) * inv / factor + smooth * inv
    return np.where(wavelen < old / hi, inv, np.where(wavelen > old / lo, inv / factor, blended))


# ─── dynamic NTK ──────────────────────────────────────────────────────────


class DynamicRotaryEmbedding(RotaryEmbedding):
    """RotaryEmbedding with dynamic (NTK-aware) scaling for long-context inference.

    `maybe_update_freqs` grows the table when a sequence is longer than the
    cached maximum and then recomputes ``inv_freq`` with HF's dynamic-NTK base
    ``theta * (factor * seq_len / max_seq_len - (factor - 1)) ** (d / (d - 2))``;
    it reverts to the original frequencies when sequences are short again.
    ``factor`` (keyword-only, default 1.0) is HF's ``rope_scaling["factor"]``.

    Example:
        >>> rope = DynamicRotaryEmbedding(64, 4, 10000.0, 16)
        >>> rope.maybe_update_freqs(np.arange(40))
        >>> rope.max_seq_len_cached
        40
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
        *,
        factor: float = 1.0,
    ) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, head_dim, None, interleaved)
        if not factor >= 1.0:
            raise ValueError(f"DynamicRotaryEmbedding: factor must be >= 1, got {factor!r}")
        self.factor = float(factor)
        self.original_max_seq_len = self.max_seq_len
        self.max_seq_len_cached = self.max_seq_len
        self.original_theta = self.theta
        self.current_theta = self.theta

    @property
    def inv_freq(self) -> Any:
        """``[head_dim // 2]`` frequencies for the current (possibly NTK-scaled) base."""
        return self._compute_inv_freqs()

    def _compute_inv_freqs(self) -> Any:
        return _inv_freqs(self.current_theta, self._rope_dim)

    def _table_len(self) -> int:
        return self.max_seq_len_cached * 2

    def _seq_len_of(self, position_ids: Any) -> int:
        if hasattr(position_ids, "type"):
            v = getattr(position_ids, "tensor", position_ids)
            if v.rank == 0:
                return 1
            try:
                return int(v.shape[-1])
            except TypeError:  # symbolic length: make room for twice the original context
                return max(self.max_seq_len_cached, self.original_max_seq_len * 2)
        arr = np.asarray(position_ids)
        return int(arr.max()) + 1 if arr.size else 0

    def maybe_update_freqs(self, position_ids: Any) -> None:
        """Update freqs_cis if the sequence exceeds max_seq_len_cached, or revert to the original version if back below
        the threshold.

        Args:
            position_ids: positions (array: its max + 1 is the length) or a
                graph value (its last dim is the length).
        """
        seq_len = self._seq_len_of(position_ids)
        if seq_len > self.max_seq_len_cached:
            d, f, orig = self._rope_dim, self.factor, self.original_max_seq_len
            self.current_theta = self.original_theta * ((f * seq_len / orig) - (f - 1)) ** (d / (d - 2))
            self.max_seq_len_cached = seq_len
            self._cache = None
        elif seq_len < self.original_max_seq_len and self.max_seq_len_cached > self.original_max_seq_len:
            self.current_theta = self.original_theta
            self.max_seq_len_cached = self.original_max_seq_len
            self._cache = None

    def freqs_cis_base(self) -> Any:
        """Computes freqs_cis dynamically using the current self.inv_freq: ``(max_seq_len_cached * 2, head_dim // 2,
        2)``.
        """
        return super().freqs_cis_base()


# ─── YaRN ─────────────────────────────────────────────────────────────────


class YarnRotaryEmbedding(_ScaledRotaryEmbedding):
    """Generic YaRN (Yet another RoPE eNhancement) Rotary Position Embedding layer.

    HF ``rope_type="yarn"``: frequencies between the ``beta_fast`` and
    ``beta_slow`` correction dims ramp from extrapolated (``inv_freq``) to
    interpolated (``inv_freq / factor``); cos and sin are scaled by
    ``0.1 * ln(factor) + 1``. ``truncate`` rounds the correction range to whole dims.

    Example:
        >>> p = YarnScalingParams(4.0, 32.0, 1.0, 4096, True)
        >>> rope = YarnRotaryEmbedding(2048, 16, 10000.0, 8192, scaling_params=p)
    """

    scaling_params: YarnScalingParams | None = None

    def _compute_inv_freqs(self) -> Any:
        p = self.scaling_params
        base = super()._compute_inv_freqs()
        if p is None:
            return base
        return _yarn_interpolate(base, p, p.factor, self._rope_dim, self.theta, p.truncate)

    def _table_scale(self) -> float:
        return _yarn_mscale(self.scaling_params.factor) if self.scaling_params is not None else 1.0

    def freqs_cis_base(self) -> Any:
        """Computes the frequency tensor for complex exponentials (cis) with YARN scaling applied."""
        return super().freqs_cis_base()


class DeepseekYarnRotaryEmbedding(_ScaledRotaryEmbedding):
    """Deepseek's YaRN (Yet another RoPE eNhancement) Rotary Position Embedding layer.

    Unlike Llama3RotaryEmbedding, the ``dim`` argument here is the rope
    dimension of the model (``qk_rope_head_dim``), not the hidden dimension:
    the table is ``(max_seq_len, dim // 2, 2)``, scaled by
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``, and inputs
    have ``dim`` as their last dimension. ``scaling_params`` is required.

    Example:
        >>> p = DeepseekYarnRopeScalingParams(40.0, 4096, 32, 1, 1.0, 1.0)
        >>> rope = DeepseekYarnRotaryEmbedding(64, 128, 10000.0, 4096, head_dim=192, scaling_params=p)
        >>> round(rope.compute_scale(), 6)
        0.135234
    """

    scaling_params: DeepseekYarnRopeScalingParams | None = None

    @staticmethod
    def _default_head_dim(dim: int, n_heads: int) -> int:
        return dim // n_heads or dim  # dim is the rope width, often smaller than n_heads

    def _check_params(self, scaling_params: Any) -> None:
        if self.dim % 2:
            raise ValueError(f"DeepseekYarnRotaryEmbedding: dim (the rope dimension) must be even, got {self.dim}")

    @property
    def _rope_dim(self) -> int:
        return self.dim

    def _table_len(self) -> int:
        return self.max_seq_len

    def _params(self) -> DeepseekYarnRopeScalingParams:
        if self.scaling_params is None:
            raise ValueError(
                "DeepseekYarnRotaryEmbedding: scaling_params (DeepseekYarnRopeScalingParams) must be provided"
            )
        return self.scaling_params

    def _compute_inv_freqs(self) -> Any:
        p = self._params()
        base = super()._compute_inv_freqs()
        # DeepSeek always rounds the correction range (floor/ceil) with an integer base.
        return _yarn_interpolate(base, p, p.scaling_factor, self.dim, float(int(self.theta)), True)

    def _table_scale(self) -> float:
        p = self._params()
        return _yarn_mscale(p.scaling_factor, p.mscale) / _yarn_mscale(p.scaling_factor, p.mscale_all_dim)

    def freqs_cis_base(self) -> Any:
        """Computes the frequency tensor for complex exponentials (cis) for a given seq_len.

        Returns:
            ``(max_seq_len, dim // 2, 2)`` float32 ``[cos, sin] * mscale``.
        """
        return super().freqs_cis_base()

    def compute_scale(self, user_scale: float | None = None) -> float:
        """``1 / sqrt(head_dim)`` (or ``user_scale``) times ``mscale(factor, mscale_all_dim) ** 2`` (DeepSeek's softmax
        scale).
        """
        p = self._params()
        m = _yarn_mscale(p.scaling_factor, p.mscale_all_dim)
        return super().compute_scale(user_scale) * m * m


# ─── LongRoPE ─────────────────────────────────────────────────────────────


class LongRoPERotaryEmbedding(_ScaledRotaryEmbedding):
    """Rotary position embedding with LongRoPE scaling for Phi-3.5 models.

    The table is stitched: positions below ``original_max_position`` use
    ``inv_freq / short_factor``, later ones ``inv_freq / long_factor`` (HF's
    ``rope_type="longrope"`` frequencies). HF multiplies cos and sin by
    ``a = sqrt(1 + ln(s) / ln(original_max_position))`` with
    ``s = max_position_embeddings / original_max_position``; this table is
    unscaled and `compute_scale` applies ``a ** 2`` instead, which gives the
    same attention logits.

    Example:
        >>> p = LongRoPEScalingParams([1.0] * 8, [4.0] * 8, 64, 256)
        >>> rope = LongRoPERotaryEmbedding(64, 4, 10000.0, 128, scaling_params=p)
    """

    scaling_params: LongRoPEScalingParams | None = None

    def _check_params(self, scaling_params: Any) -> None:
        if scaling_params is not None:
            need = self.head_dim // 2
            for which in ("short_factor", "long_factor"):
                got = len(getattr(scaling_params, which))
                if got < need:
                    raise ValueError(
                        f"LongRoPERotaryEmbedding: {which} needs head_dim // 2 = {need} entries, got {got}"
                    )

    def _scaled(self, factors: list[float]) -> Any:
        f = np.asarray(factors[: self.head_dim // 2], np.float32)
        return self._compute_inv_freqs() / ops.constant(f, DType.float32, _CPU)

    def _build_table(self) -> Any:
        p = self.scaling_params
        if p is None:
            return super()._build_table()
        total = self._table_len()
        split = min(p.original_max_position, total)
        parts = [_cos_sin(_positions(0, split), self._scaled(p.short_factor))]
        if split < total:
            parts.append(_cos_sin(_positions(split, total), self._scaled(p.long_factor)))
        return parts[0] if len(parts) == 1 else ops.concat(parts, axis=0)

    def freqs_cis_base(self) -> Any:
        """Computes the frequency tensor for complex exponentials (cis) with LongRoPE scaling.

        Returns:
            ``(max_seq_len * 2, head_dim // 2, 2)``: rows ``< original_max_position``
            use ``short_factor``, the rest ``long_factor``.
        """
        return super().freqs_cis_base()

    def compute_scale(self, user_scale: float | None = None) -> float:
        """Compute attention scale with LongRoPE adjustment (``user_scale`` is returned unchanged)."""
        if user_scale is not None:
            return user_scale
        scale = super().compute_scale()
        p = self.scaling_params
        if p is not None:
            s = p.max_position_embeddings / p.original_max_position
            if s > 1.0:
                scale *= 1 + math.log(s) / math.log(p.original_max_position)
        return scale
