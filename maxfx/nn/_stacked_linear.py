"""`StackedLinear`: several projections of one input (Q/K/V, gate/up) as one matmul.

``y = x @ concat([W_1; ...; W_n]).T (+ concat(b_i))``, whose last axis holds the
projections' outputs one after another (``out_dims``). Two layouts:

* stacked (``stacked=True``): one ``weight [sum(out_dims), in_dim]`` (and
  ``bias``), for checkpoints that store the fused tensor (``qkv_proj.weight``).
* unfused (``stacked=False``): one child `Linear` per name, concatenated when
  the graph is built. The module leaves its own attribute name out of its
  children's weight names (``_omit_module_attr_name``), so ``self.qkv_proj =
  StackedLinear(names=["q_proj", "k_proj", "v_proj"], ...)`` reads the
  checkpoint's ``q_proj.weight`` etc.

Float8 (``quant_config``, unfused): per-tensor static weights are dequantized
with their own scales and requantized under the largest one; per-tensor dynamic
scales become one scale per row; row-wise and block scales are concatenated.

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph import DeviceRef
    >>> qkv = StackedLinear(64, [32, 16, 16], ["q_proj", "k_proj", "v_proj"], DType.float32, DeviceRef.CPU())
    >>> sorted(qkv.raw_state_dict())
    ['k_proj.weight', 'q_proj.weight', 'v_proj.weight']
    >>> fused = StackedLinear(64, [32, 16, 16], ["q", "k", "v"], DType.float32, DeviceRef.CPU(), stacked=True)
    >>> [int(d) for d in fused.weight.shape]
    [64, 64]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import ShardingStrategy, Weight, _split
from maxfx.nn._basic import Linear, clamp
from maxfx.nn._float8_linear import scaled_linear
from maxfx.nn._layer import Module
from maxfx.nn._linear_sharding import bias_strategy, splits_columns

__all__ = ["StackedLinear"]


class StackedLinear(Module):
    """Projections of one input stacked along the output axis (see the module docstring).

    Args:
        in_dim: input features, shared by every projection.
        out_dims: output features of each projection.
        names: each projection's name (unfused: its child's attribute and weight name).
        dtype: the weights' dtype.
        device: the device the matmul runs on.
        stacked: one fused weight (True) or one child `Linear` per projection (False).
        has_bias: each projection has a bias.
        linear_cls: the child layer class (unfused).
        quant_config: float8 settings (`QuantConfig` / `Float8Config`), unfused
            or dynamic-scale stacked layers.
        clip_weight: clamp the weights to ``[-clip_weight, clip_weight]`` (unfused).

    Raises:
        ValueError: ``names`` and ``out_dims`` differ in length; a stacked layer
            with ``clip_weight`` or a static float8 ``quant_config``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dims: Sequence[int],
        names: Sequence[str],
        dtype: DType,
        device: Any,
        stacked: bool = False,
        has_bias: bool = False,
        linear_cls: Callable[..., Linear] = Linear,
        quant_config: Any = None,
        clip_weight: float | None = None,
        _is_sharding: bool = False,
    ) -> None:
        super().__init__()
        self._names = [str(n) for n in names]
        self._out_dims = [int(d) for d in out_dims]
        if len(self._names) != len(self._out_dims) or not self._names:
            raise ValueError(
                f"StackedLinear: needs one name per output dim, got names {self._names} and out_dims {self._out_dims}"
            )
        self._stacked = bool(stacked)
        self._in_dim = int(in_dim)
        self._has_bias = bool(has_bias)
        self._clip_weight = clip_weight
        self._quant_config = quant_config
        self._device = DeviceRef.from_device(device) if device is not None else DeviceRef.CPU()
        if _is_sharding:  # `shard` fills in the per-device weights or children
            return
        if stacked:
            if clip_weight:
                raise ValueError("StackedLinear: clip_weight is not yet supported with stacked=True; use stacked=False")
            if quant_config is not None and quant_config.is_static:
                raise ValueError(
                    "StackedLinear: float8 static scaling with stacked=True is not supported; use stacked=False (one "
                    "scale per projection)"
                )
            total = sum(self._out_dims)
            self.weight = Weight("weight", dtype, [total, self._in_dim], DeviceRef.CPU())
            if has_bias:
                self.bias = Weight("bias", dtype, [total], DeviceRef.CPU())
            return
        for name, out_dim in zip(self._names, self._out_dims):
            child = linear_cls(
                in_dim=self._in_dim,
                out_dim=out_dim,
                dtype=dtype,
                device=device,
                has_bias=has_bias,
                quant_config=quant_config,
                clip_weight=clip_weight,
            )
            setattr(self, name, child)

    @property
    def _omit_module_attr_name(self) -> bool:  # type: ignore[override]
        """Unfused layers keep their children's names (checkpoint names); a fused weight keeps the attribute name."""
        return not self._stacked

    def _children(self) -> list[Linear]:
        return [getattr(self, n) for n in self._names]

    def _child(self, name: str) -> Linear:
        """The unfused projection called ``name`` (e.g. ``qkv_proj._child("q_proj")``).

        Raises:
            ValueError: a stacked layer (one fused weight, no children) or an unknown name.
        """
        if self._stacked or name not in self._names:
            raise ValueError(
                f"StackedLinear: no child projection {name!r} (stacked={self._stacked}, names={self._names})"
            )
        return getattr(self, name)

    # -- the stacked tensors -------------------------------------------------------
    @property
    def stacked_weight(self) -> Any:
        """``[sum(out_dims), in_dim]``: the fused weight, or the children's concatenated
        (clipped; static per-tensor float8 requantized under one scale)."""
        if self._stacked:
            return self.weight
        children = self._children()
        weights = [child.weight for child in children]
        if self._clip_weight:
            weights = [clamp(w, -self._clip_weight, self._clip_weight) for w in weights]
        if self._static_tensor_scales():
            # Each projection has its own scale: dequantize, then requantize under the largest.
            deq = [
                ops.cast(w, DType.float32) * ops.cast(c.weight_scale, DType.float32).to(w.device)
                for w, c in zip(weights, children)
            ]
            scale = ops.cast(self.stacked_weight_scale, DType.float32)
            return ops.quantize_static_float8(ops.concat(deq), scale.to(deq[0].device), False)
        return ops.concat(weights) if len(weights) > 1 else weights[0]

    def _static_tensor_scales(self) -> bool:
        cfg = self._quant_config
        return cfg is not None and cfg.is_static and cfg.weight_scale.is_tensor

    @property
    def stacked_bias(self) -> Any:
        """``[sum(out_dims)]`` bias, or None without one."""
        if not self._has_bias:
            return None
        if self._stacked:
            return self.bias
        biases = [child.bias for child in self._children()]
        return ops.concat(biases) if len(biases) > 1 else biases[0]

    @property
    def stacked_input_scale(self) -> Any:
        """The largest of the projections' static input scales (a scalar); None when dynamic or unquantized."""
        cfg = self._quant_config
        if cfg is None or cfg.is_dynamic:
            return None
        scales = [child.input_scale.reshape([1]) for child in self._children()]
        return ops.max(ops.concat(scales), axis=0).reshape([])

    @property
    def stacked_weight_scale(self) -> Any:
        """The weight scale of the stacked weight; None unquantized.

        Row-wise / block scales are concatenated; per-tensor dynamic scales are
        repeated over each projection's rows (``[sum(out_dims), 1]``); per-tensor
        static scales combine to their maximum (see `stacked_weight`).
        """
        cfg = self._quant_config
        if cfg is None:
            return None
        if self._stacked:
            raise ValueError(
                "StackedLinear: a stacked=True layer has no float8 weight scales; use stacked=False for float8 layers"
            )
        children = self._children()
        if not cfg.weight_scale.is_tensor:
            scales = [child.weight_scale for child in children]
            return ops.concat(scales) if len(scales) > 1 else scales[0]
        if cfg.is_dynamic:
            rows = [
                ops.broadcast_to(child.weight_scale.reshape([1, 1]), [int(child.weight.shape[0]), 1])
                for child in children
            ]
            return ops.concat(rows)
        return ops.max(ops.concat([child.weight_scale.reshape([1]) for child in children]), axis=0).reshape([])

    # -- sharding ----------------------------------------------------------------
    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """The weights' `ShardingStrategy` (None: not sharded)."""
        if self._stacked:
            return self.weight.sharding_strategy
        return self._children()[0].sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if self._stacked:
            self.weight.sharding_strategy = strategy
            if self._has_bias:
                self.bias.sharding_strategy = bias_strategy(strategy)
        else:
            for child in self._children():
                child.sharding_strategy = strategy

    def shard(self, devices: Iterable[Any]) -> list[StackedLinear]:
        """One `StackedLinear` per device, holding its shards (children's shards when unfused).

        Raises:
            ValueError: no sharding strategy was set.
        """
        devices = list(devices)
        if self.sharding_strategy is None:
            raise ValueError("StackedLinear layer cannot be sharded because no sharding strategy was provided.")
        n = len(devices)

        def empty(device: Any, out_dims: list[int], dtype: DType) -> StackedLinear:
            return StackedLinear(
                self._in_dim, out_dims, self._names, dtype, device, stacked=self._stacked, has_bias=self._has_bias,
                quant_config=self._quant_config, clip_weight=self._clip_weight, _is_sharding=True,
            )  # fmt: skip

        shards = []
        if self._stacked:
            strategy = self.weight.sharding_strategy
            weights = self.weight.shard(devices)
            biases = self.bias.shard(devices) if self._has_bias else [None] * n
            for i, device in enumerate(devices):
                sl = empty(device, [_split(d, i, n)[1] for d in self._out_dims], self.weight.dtype)
                sl._in_dim = int(weights[i].shape[1])
                sl.weight = weights[i]
                if biases[i] is not None and not (splits_columns(strategy) and i > 0):  # partial sums: bias once
                    sl.bias = biases[i]
                else:
                    sl._has_bias = self._has_bias and i == 0
                shards.append(sl)
            return shards
        per_child = [child.shard(devices) for child in self._children()]
        for i, device in enumerate(devices):
            mine = [parts[i] for parts in per_child]
            sl = empty(device, [c.out_dim for c in mine], mine[0].weight.dtype)
            sl._in_dim = mine[0].in_dim
            for name, child in zip(self._names, mine):
                setattr(sl, name, child)
            if self._has_bias and any(c.bias is None for c in mine):
                sl._has_bias = False  # column splits keep the bias on device 0 only
            shards.append(sl)
        return shards

    # -- call ----------------------------------------------------------------------
    def __call__(self, x: Any) -> Any:
        """``x @ stacked_weight.T + stacked_bias``, float8 per ``quant_config``; output ``[..., sum(out_dims)]``."""
        weight = self.stacked_weight
        if weight.device != x.device:
            weight = weight.to(x.device)
        if self._quant_config is not None:
            scale = self.stacked_weight_scale
            input_scale = self.stacked_input_scale
            out = scaled_linear(
                x, weight, scale.to(x.device), input_scale.to(x.device) if input_scale is not None else None,
                self._quant_config, self._in_dim, int(weight.shape[0]), "StackedLinear",
            )  # fmt: skip
        else:
            out = x @ weight.T
        bias = self.stacked_bias
        if bias is not None:
            out = out + (bias.to(out.device) if bias.device != out.device else bias)
        return out

    def __repr__(self) -> str:
        return (
            f"StackedLinear(in_dim={self._in_dim}, out_dims={self._out_dims}, names={self._names}, "
            f"stacked={self._stacked}, bias={self._has_bias})"
        )
