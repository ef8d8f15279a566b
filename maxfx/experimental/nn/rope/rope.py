"""Rotary position embeddings of the eager Module API (``max.experimental.nn.rope.rope``, re-exported by
``max.experimental.nn.rope``).

`RotaryEmbedding` holds a precomputed rotation table ``weight`` of shape
``(max_sequence_length, dim // 2, 2)``: ``weight[p, i] = [cos(p * f_i),
sin(p * f_i)]`` with ``f_i = base ** (-2i / dim)`` (`positional_embedding`
builds it). As in MAX the table is the module's one *parameter*: it appears in
``parameters`` and ``state_dict()`` as ``"weight"``, becomes a graph weight
under `Module.compile` and a pytree leaf under ``jax.jit``.

Calling the layer rotates a ``(batch, seq_len, n_heads, head_dim)`` activation
by the angles of positions ``start_pos ... start_pos + seq_len - 1``:

* `RotaryEmbedding` reads ``head_dim`` as interleaved (real, imaginary) pairs
  ``(2i, 2i + 1)`` (the GPT-J / Meta layout);
* `TransposedRotaryEmbedding` reads the first half of ``head_dim`` as the real
  parts and the second half as the imaginary ones, pairs ``(i, i + head_dim/2)``
  (Hugging Face's ``rotate_half`` layout).

The rotation itself is ``maxfx._rope_math.rotate_by_table`` (shared with the graph-API
layers and ``maxfx.models``); the result dtype is MAX's promotion of the
input's and the table's dtypes (an input of the table's dtype keeps it).

Example:
    >>> from maxfx.experimental.nn.rope import RotaryEmbedding, positional_embedding
    >>> from maxfx.experimental.tensor import Tensor
    >>> rope = RotaryEmbedding(positional_embedding(dim=8, base=10000.0, max_sequence_length=16))
    >>> rope
    RotaryEmbedding(dim=8, max_sequence_length=16)
    >>> rope(Tensor.ones([2, 4, 3, 8]), start_pos=5).shape
    [Dim(2), Dim(4), Dim(3), Dim(8)]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType, promote_strong
from maxfx._rope_math import default_inv_freq, rotate_by_table
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn._layers import _dim
from maxfx.experimental.nn.module import Module, module_dataclass
from maxfx.experimental.tensor import defaults, defaults_like

__all__ = ["RotaryEmbedding", "TransposedRotaryEmbedding", "embed", "positional_embedding", "theta"]

DimLike = int | str | Dim


# ─── the rotation table ────────────────────────────────────────────────────


def theta(dim: int, base: float) -> Tensor:
    """The RoPE inverse frequencies ``base ** (-2i / dim)`` for ``i < dim // 2``.

    See "RoFormer: Enhanced Transformer with Rotary Position Embedding"
    (arxiv.org/abs/2104.09864). The exponent is computed in float64 and the
    result cast to the default dtype (`defaults`: float32 on the CPU,
    bfloat16 on an accelerator), on the default device.

    Args:
        dim: The embedding (head) dimension; each (real, imaginary) component
            counts as one dim, so the result has ``dim // 2`` entries.
        base: The frequency base (often called ``theta``, e.g. ``10000.0``).

    Raises:
        TypeError: ``dim`` is not an int or ``base`` not a real number.
        ValueError: ``dim`` is not positive and even, or ``base`` is not positive.

    Example:
        >>> theta(dim=8, base=10000.0).to_numpy().tolist()
        [1.0, 0.10000000149011612, 0.009999999776482582, 0.0010000000474974513]
    """
    n = _dim(dim, "theta: dim")
    if n % 2:
        raise ValueError(f"theta: dim must be even (RoPE rotates pairs of components), got {n}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) and not hasattr(base, "__float__"):
        raise TypeError(f"theta: base must be a real number, got {type(base).__name__}")
    if not float(base) > 0:
        raise ValueError(f"theta: base must be positive, got {base!r}")
    dtype, device = defaults()
    frequencies = Tensor(default_inv_freq(float(base), n), dtype=DType.float64, device=device)
    return frequencies.cast(dtype)


def embed(frequencies: Tensor, max_sequence_length: int) -> Tensor:
    """The rotation table ``[cos(p * f), sin(p * f)]`` for positions ``p < max_sequence_length``.

    As in MAX the angles ``p * f`` are formed in float64, cast to
    ``frequencies.dtype``, and cos/sin taken in that dtype; the table has the
    frequencies' dtype and device.

    Args:
        frequencies: ``(n,)`` frequencies (e.g. from `theta`).
        max_sequence_length: The number of positions to embed.

    Returns:
        ``(max_sequence_length, n, 2)``: the (cos, sin) pair of every angle.

    Example:
        >>> embed(Tensor([1.0, 0.5]), 3).shape
        [Dim(3), Dim(2), Dim(2)]
    """
    length = _dim(max_sequence_length, "embed: max_sequence_length")
    if len(frequencies.shape) != 1:
        raise ValueError(f"embed: frequencies must be 1-D, got shape {[str(d) for d in frequencies.shape]}")
    with defaults_like(frequencies):
        positions = Tensor.arange(length, dtype=DType.float64)
        angles = F.outer(positions, frequencies).cast(frequencies.dtype)  # (length, n)
        return F.stack([F.cos(angles), F.sin(angles)], axis=-1)  # (length, n, 2)


def positional_embedding(dim: int, base: float, max_sequence_length: int) -> Tensor:
    """The RoPE table of ``dim``-wide heads for ``max_sequence_length`` positions: ``embed(theta(dim, base), ...)``.

    Returns:
        ``(max_sequence_length, dim // 2, 2)`` in the default dtype, the
        ``weight`` `RotaryEmbedding` takes.

    Example:
        >>> positional_embedding(dim=20, base=10000.0, max_sequence_length=5).shape
        [Dim(5), Dim(10), Dim(2)]
    """
    return embed(theta(dim, base), max_sequence_length)


# ─── layers ─────────────────────────────────────────────────────────────────


@module_dataclass
class RotaryEmbedding(Module):
    """Applies rotary position embeddings (RoPE) to interleaved (real, imaginary) pairs.

    ``weight`` is the precomputed rotation table, shape
    ``(max_sequence_length, dim // 2, 2)`` (see `positional_embedding`); it is
    the module's parameter. Calling the module on ``x: (batch, seq_len,
    n_heads, dim)`` rotates each pair ``(x[..., 2i], x[..., 2i + 1])`` at
    sequence index ``s`` by the angle of position ``start_pos + s``.

    Example:
        >>> from maxfx.experimental.nn.rope import RotaryEmbedding, positional_embedding
        >>> from maxfx.experimental.tensor import Tensor
        >>> rope = RotaryEmbedding(weight=positional_embedding(64, 10000.0, 2048))
        >>> rope.dim, rope.max_sequence_length
        (64, 2048)
        >>> [name for name, _ in rope.parameters]
        ['weight']
        >>> rope(Tensor.ones([4, 16, 2, 64]), start_pos=7).shape
        [Dim(4), Dim(16), Dim(2), Dim(64)]
    """

    weight: Tensor
    """Precomputed ``(max_sequence_length, dim // 2, 2)`` table of (cos, sin) pairs."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not isinstance(self.weight, Tensor):
            raise TypeError(
                f"{name}: weight must be a Tensor of shape (max_sequence_length, dim // 2, 2), got "
                f"{type(self.weight).__name__}"
            )
        shape = list(self.weight.shape)
        if len(shape) != 3 or str(shape[2]) != "2":
            raise ValueError(
                f"{name}: weight must have shape (max_sequence_length, dim // 2, 2), got {[str(d) for d in shape]}"
            )

    @property
    def dim(self) -> int:
        """The rotated embedding (head) dimension: twice the table's second dim."""
        return int(self.weight.shape[1]) * 2

    @property
    def max_sequence_length(self) -> int:
        """The number of positions in the table."""
        return int(self.weight.shape[0])

    def __rich_repr__(self) -> Iterator[tuple[str, int]]:
        """MAX's: ``dim`` and ``max_sequence_length`` (``Module.__repr__`` prints them)."""
        yield "dim", self.dim
        yield "max_sequence_length", self.max_sequence_length

    # the two layouts differ only in which components form a (real, imaginary) pair
    _interleaved = True

    def forward(self, x: Tensor, start_pos: DimLike = 0) -> Tensor:
        """Applies RoPE to ``x``; ``seq_len`` is ``x.shape[1]``.

        Args:
            x: ``(batch, seq_len, n_heads, dim)`` activations; ``dim`` holds
                alternating (real, imaginary) parts.
            start_pos: The position of ``x[:, 0]`` (an int, or a symbolic
                `Dim` inside a graph); defaults to 0.

        Returns:
            ``x`` rotated, with ``x``'s shape, in the promotion of ``x``'s and
            ``weight``'s dtypes.

        Raises:
            ValueError: ``x`` is not rank 4, its last dim is not ``self.dim``
                (or is odd), the positions run past ``max_sequence_length``,
                or the dtypes of ``x`` and ``weight`` do not promote (as in MAX,
                e.g. bfloat16 with float16, int32 with float32).
            TypeError: ``start_pos`` is not an int, str or Dim.
        """
        start, dtype = self._check(x, start_pos)
        if x.dtype != dtype:
            x = x.cast(dtype)
        return rotate_by_table(x, self.weight, start, x.shape[1], interleaved=self._interleaved)

    def _check(self, x: Any, start_pos: DimLike) -> tuple[Dim, DType]:
        """Check ``x`` and ``start_pos``; return the start position as a `Dim` and the result dtype."""
        name = type(self).__name__
        shape = list(x.shape)
        if len(shape) != 4:
            raise ValueError(
                f"{name}: expected x of shape (batch, seq_len, n_heads, head_dim), got rank {len(shape)} shape "
                f"{[str(d) for d in shape]}"
            )
        head_dim = shape[-1]
        if not isinstance(head_dim, StaticDim):
            raise ValueError(
                f"{name}: the last dim of x must be the static head_dim={self.dim}, got the symbolic dim {head_dim}"
            )
        if int(head_dim) % 2:
            raise ValueError(
                f"{name}: the last dim of x ({int(head_dim)}) must be even: RoPE rotates pairs of components"
            )
        if int(head_dim) != self.dim:
            raise ValueError(
                f"{name}: the last dim of x ({int(head_dim)}) must equal the table's dim {self.dim} (weight "
                f"{[int(d) for d in self.weight.shape]})"
            )
        try:
            dtype = promote_strong(x.dtype, self.weight.dtype)
        except ValueError as e:
            raise ValueError(
                f"{name}: x ({x.dtype}) and weight ({self.weight.dtype}) have no common dtype: {e}"
            ) from None
        if not dtype.is_float():
            raise ValueError(
                f"{name}: x ({x.dtype}) and weight ({self.weight.dtype}) must promote to a floating-point dtype, got "
                f"{dtype}"
            )
        start = Dim(start_pos)
        seq_len = shape[1]
        if isinstance(start, StaticDim):
            if int(start) < 0:
                raise ValueError(f"{name}: start_pos must be >= 0, got {int(start)}")
            if isinstance(seq_len, StaticDim) and int(start) + int(seq_len) > self.max_sequence_length:
                raise ValueError(
                    f"{name}: positions {int(start)}..{int(start) + int(seq_len) - 1} run past "
                    f"max_sequence_length={self.max_sequence_length}"
                )
        return start, dtype


class TransposedRotaryEmbedding(RotaryEmbedding):
    """Applies RoPE with a transposed (half-split) head layout.

    Same table and arguments as `RotaryEmbedding`, but the first half of
    ``head_dim`` holds the real parts and the second half the imaginary ones:
    pair ``i`` is ``(x[..., i], x[..., i + head_dim // 2])`` (Hugging Face's
    ``rotate_half`` convention). Equal to `RotaryEmbedding` applied after
    interleaving the halves.

    Example:
        >>> from maxfx.experimental.nn.rope import TransposedRotaryEmbedding, positional_embedding
        >>> from maxfx.experimental.tensor import Tensor
        >>> rope = TransposedRotaryEmbedding(positional_embedding(8, 10000.0, 32))
        >>> rope
        TransposedRotaryEmbedding(dim=8, max_sequence_length=32)
        >>> rope(Tensor.ones([1, 3, 2, 8]), start_pos=4).shape
        [Dim(1), Dim(3), Dim(2), Dim(8)]
    """

    _interleaved = False

    def forward(self, x: Tensor, start_pos: DimLike = 0) -> Tensor:
        """Applies RoPE to ``x``; ``seq_len`` is ``x.shape[1]``.

        Args:
            x: ``(batch, seq_len, n_heads, dim)`` activations; the first half
                of ``dim`` holds the real parts, the second half the imaginary ones.
            start_pos: The position of ``x[:, 0]`` (an int, or a symbolic
                `Dim` inside a graph); defaults to 0.

        Returns:
            ``x`` rotated, with ``x``'s shape, in the promotion of ``x``'s and
            ``weight``'s dtypes.

        Raises:
            ValueError, TypeError: as `RotaryEmbedding.forward`.
        """
        return super().forward(x, start_pos)
