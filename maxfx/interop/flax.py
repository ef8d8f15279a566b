"""Parameters between maxfx ``experimental.nn`` Modules and ``flax.nnx``.

`to_flax` writes a maxfx Module's parameters into an ``nnx.Module`` (in place)
or an ``nnx.State`` / nested dict (a new one is returned); `from_flax` loads an
``nnx.Module``, ``nnx.State`` or nested dict into a maxfx Module (in place).
`flax_paths` shows which flax path each maxfx parameter maps to.

Layouts are converted per layer: maxfx ``Linear.weight`` is ``[out, in]``
while ``nnx.Linear.kernel`` is ``[in, out]``; ``Embedding.weight`` is
``nnx.Embed.embedding``; ``LayerNorm.weight``/``bias`` are
``nnx.LayerNorm.scale``/``bias``. A maxfx ``Sequential`` matches an
``nnx.Sequential`` (its ``layers``), an ``nnx.List`` or a Python list.

Example:
    >>> from flax import nnx
    >>> from maxfx.experimental.nn import Linear
    >>> from maxfx.interop.flax import to_flax
    >>> layer = Linear(3, 2)
    >>> flax_layer = to_flax(layer, nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> flax_layer.kernel.shape
    (3, 2)
"""

from maxfx.interop._flax import StructureMismatchError, flax_paths, from_flax, to_flax

__all__ = ["StructureMismatchError", "flax_paths", "from_flax", "to_flax"]
