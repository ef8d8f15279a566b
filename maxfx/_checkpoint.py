"""`save` / `restore`: checkpoints of Modules, optax state, any pytree of Tensors, through Orbax.

A Module is a pytree whose leaves are its parameter Tensors, and optax state is
a pytree of arrays, so one checkpoint format covers both: the tree's leaves are
written by Orbax (``orbax-checkpoint``: atomic writes through a temporary
folder renamed on commit, sharded arrays written per shard), beside a small
JSON record of each leaf's key path. ``restore`` needs a ``like`` tree of the
same structure (a freshly built Module, ``maxfx.optim.init(...)``): its leaves
give the shapes, dtypes and shardings to read into, and its structure gives the
types back (Tensors come back as maxfx Tensors, jax arrays as jax arrays).

Example:
    >>> import optax, maxfx
    >>> from maxfx.experimental.nn import Linear
    >>> model = Linear(2, 1)
    >>> state = maxfx.optim.init(optax.adam(1e-3), model)
    >>> maxfx.save("/tmp/ckpt_example", {"model": model, "opt": state}, overwrite=True)
    >>> back = maxfx.restore("/tmp/ckpt_example", {"model": Linear(2, 1), "opt": state})
    >>> bool((back["model"].weight.to_numpy() == model.weight.to_numpy()).all())
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from lowering.x64 import run
from maxfx.experimental._tensor import Tensor

__all__ = ["restore", "save"]

# Bumped when the on-disk layout changes, so an old reader refuses a newer checkpoint clearly.
_FORMAT = 1


def _leaves(tree: Any, where: str) -> tuple[list[tuple[str, Any]], Any]:
    """(key path, jax array) for every leaf of ``tree`` (a Tensor's array is its leaf), and the treedef."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    # Names stop at Tensors (a Tensor has exactly one child, its array): "['w']", not "['w'][<flat index 0>]".
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, Tensor))[0]]
    out = []
    for path, leaf in zip(paths, leaves, strict=True):
        name = jax.tree_util.keystr(path) or "<root>"
        if isinstance(leaf, (int, float, bool, complex, np.generic, np.ndarray)):
            leaf = np.asarray(leaf)
        elif isinstance(leaf, jax.core.Tracer) or not isinstance(leaf, jax.Array):
            # A Tensor traced inside jit flattens to a graph value or tracer: there is no value to write.
            raise TypeError(
                f"{where}: leaf {name} is a {type(leaf).__name__}; only concrete Tensors, arrays and numbers can be "
                "checkpointed (call it outside jit)"
            )
        out.append((name, leaf))
    return out, treedef


def _key(i: int) -> str:
    # Index keys: key paths like "['layers'][0].weight" are not safe file or kvstore names.
    return f"{i:06d}"


def save(path: os.PathLike[str] | str, tree: Any, *, overwrite: bool = False) -> None:
    """Write ``tree`` (a Module, optax state, or any pytree of Tensors/arrays) to the folder ``path``.

    The write is atomic: Orbax writes a temporary folder and renames it when
    complete, so an interrupted save never leaves a half-written ``path``.
    Returns when the checkpoint is on disk.

    Args:
        path: the checkpoint folder (must not exist unless ``overwrite``).
        tree: what to save; e.g. ``{"model": model, "opt": opt_state}``.
        overwrite: replace an existing checkpoint at ``path``.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
        TypeError: a leaf is not a concrete Tensor, array or number.

    Example:
        >>> from maxfx.experimental.tensor import Tensor
        >>> save("/tmp/ckpt_save_example", {"w": Tensor.ones([2])}, overwrite=True)
    """
    where = "maxfx.save"
    target = Path(path).absolute()
    if target.exists() and not overwrite:
        raise FileExistsError(f"{where}: {str(target)!r} exists; pass overwrite=True to replace it")
    leaves, _ = _leaves(tree, where)
    arrays = {_key(i): a for i, (_, a) in enumerate(leaves)}
    meta = {
        "format": _FORMAT,
        "paths": [name for name, _ in leaves],
        "shapes": [list(a.shape) for _, a in leaves],
        "dtypes": [str(a.dtype) for _, a in leaves],
    }
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:  # run: int64/float64 leaves keep their width
        run(
            ckptr.save,
            target,
            ocp.args.Composite(arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)),
            force=overwrite,
        )


def restore(path: os.PathLike[str] | str, like: Any) -> Any:
    """Read the checkpoint at ``path`` into a tree shaped like ``like``.

    ``like`` gives the structure, shapes, dtypes and shardings (e.g. a freshly
    built Module and ``maxfx.optim.init(optimizer, model)``); its values are not
    used. The result has ``like``'s structure and leaf types: Tensors come back
    as maxfx Tensors, jax arrays as jax arrays on ``like``'s shardings, numpy
    arrays as numpy arrays, numbers as numbers.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: the checkpoint's leaves differ from ``like``'s in number,
            key path, shape or dtype (the message names the first difference),
            or it was written by a newer maxfx.

    Example:
        >>> from maxfx.experimental.tensor import Tensor
        >>> save("/tmp/ckpt_restore_example", {"w": Tensor.ones([2])}, overwrite=True)
        >>> restore("/tmp/ckpt_restore_example", {"w": Tensor.zeros([2])})["w"].to_numpy()
        array([1., 1.], dtype=float32)
    """
    where = "maxfx.restore"
    source = Path(path).absolute()
    if not source.is_dir():
        raise FileNotFoundError(f"{where}: no checkpoint at {str(source)!r}")
    want, treedef = _leaves(like, where)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        meta = ckptr.restore(source, ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        _check(meta, want, source)
        abstract = {
            _key(i): jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=_sharding(a)) for i, (_, a) in enumerate(want)
        }
        arrays = run(ckptr.restore, source, ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract)))[
            "arrays"
        ]  # run: as in save
    flat_like = jax.tree_util.tree_leaves(like)
    values = [_like_type(arrays[_key(i)], ref) for i, ref in enumerate(flat_like)]
    return jax.tree_util.tree_unflatten(treedef, values)


def _sharding(a: Any) -> Any:
    """Where to put the restored leaf: ``like``'s sharding for jax arrays, the default device otherwise."""
    if isinstance(a, jax.Array):
        return a.sharding
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _like_type(value: jax.Array, ref: Any) -> Any:
    """The restored array as the type of ``like``'s leaf (a Tensor's leaf is its jax array: unflatten rewraps it)."""
    if isinstance(ref, np.ndarray):
        return np.asarray(value)
    if isinstance(ref, (bool, int, float, complex)):
        return type(ref)(np.asarray(value).item())
    if isinstance(ref, np.generic):
        return np.asarray(value)[()]
    return value


def _check(meta: dict[str, Any], want: list[tuple[str, Any]], source: Path) -> None:
    where = f"maxfx.restore({str(source)!r})"
    if meta.get("format", 0) > _FORMAT:
        raise ValueError(
            f"{where}: checkpoint format {meta.get('format')} is newer than this maxfx reads ({_FORMAT}); upgrade maxfx"
        )
    paths, shapes, dtypes = meta["paths"], meta["shapes"], meta["dtypes"]
    if len(paths) != len(want):
        raise ValueError(
            f"{where}: the checkpoint has {len(paths)} leaves but `like` has {len(want)}; pass a tree built like the "
            "one saved"
        )
    for i, (name, a) in enumerate(want):
        got = (paths[i], list(shapes[i]), dtypes[i])
        exp = (name, list(a.shape), str(a.dtype))
        if got != exp:
            raise ValueError(
                f"{where}: leaf {i} differs: the checkpoint has {got[0]} {got[2]}{got[1]}, `like` has {exp[0]} "
                f"{exp[2]}{exp[1]}; pass a tree built like the one saved"
            )
