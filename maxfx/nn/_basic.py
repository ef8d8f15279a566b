"""Graph-API layers: `Linear`, `MLP`, `Embedding`, `LayerNorm`, `RMSNorm`, `Sequential`, `clamp`.

Each builds graph ops on `TensorValue`\\ s inside ``with Graph(...)``. Weights
are created on the CPU with local names (``weight``, ``bias``) and moved to the
layer's device in the graph; the Module tree qualifies their names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import ShardingStrategy, Weight
from maxfx.graph.quantization import QuantizationEncoding
from maxfx.nn._float8_linear import float8_matmul, float8_weights
from maxfx.nn._graph_util import device_ref
from maxfx.nn._graph_util import on_device as _on
from maxfx.nn._layer import Layer, LayerList, Module, Shardable
from maxfx.nn._linear_sharding import set_linear_strategy, shard_linear
from maxfx.nn.activation import activation_table

__all__ = ["Linear", "MLP", "Embedding", "LayerNorm", "RMSNorm", "Sequential", "clamp"]


def clamp(x: Any, min: float | None = None, max: float | None = None) -> Any:  # noqa: A002 - MAX's names
    """``x`` limited to ``[min, max]``; a None bound is unbounded.

    Example:
        >>> y = clamp(x, min=-1.0, max=1.0)  # doctest: +SKIP
    """
    if min is not None:
        x = ops.max(x, min)
    if max is not None:
        x = ops.min(x, max)
    return x


def _weight_shape(
    encoding: QuantizationEncoding | None, out_dim: int, in_dim: int, where: str
) -> tuple[DType | None, list[int]]:
    if encoding is None:
        return None, [out_dim, in_dim]
    elems, nbytes = encoding.block_parameters.elements_per_block, encoding.block_parameters.block_size
    if in_dim % elems:
        raise ValueError(f"{where}: in_dim {in_dim} must be a multiple of the {encoding.name} block size {elems}")
    return DType.uint8, [out_dim, in_dim // elems * nbytes]


class Linear(Module, Shardable):
    """``y = x @ weight.T + bias`` with ``weight: [out_dim, in_dim]``.

    With ``quantization_encoding`` (GGUF Q4_0/Q4_K/Q6_K...) the weight holds
    packed blocks (uint8) and the product is ``ops.qmatmul``. ``clip_weight``
    clamps the weight to ``[-clip_weight, clip_weight]`` first.

    Example:
        >>> lin = Linear(4, 2, DType.float32, DeviceRef.CPU(), has_bias=True)
        >>> sorted(lin.state_dict())
        ['bias', 'weight']
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        device: Any,
        has_bias: bool = False,
        quantization_encoding: QuantizationEncoding | None = None,
        quant_config: Any = None,
        name: str | None = None,
        clip_weight: float | None = None,
        is_sharding: bool = False,
        float8_config: Any = None,
    ):
        super().__init__()
        if float8_config is not None and quant_config is not None and float8_config is not quant_config:
            raise ValueError(
                "Linear: pass one of quant_config and float8_config (float8_config is its older name), not both"
            )
        # MAX's quant_config keeps the given dtype for the weight (float8 checkpoints pass
        # DType.float8_e4m3fn); the older float8_config always stores float8_e4m3fn.
        weight_dtype = dtype if quant_config is not None else DType.float8_e4m3fn
        quant_config = quant_config if quant_config is not None else float8_config
        if quant_config is not None and quantization_encoding is not None:
            raise ValueError("Linear: float8_config and quantization_encoding are exclusive; pick one weight format")
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.quant_config = self.float8_config = quant_config
        self.device = device_ref(device)
        self.quantization_encoding = quantization_encoding
        self.clip_weight = clip_weight
        self.input_scale = None
        self.weight_scale = None
        self.bias = None
        if is_sharding:  # `shard` fills in the per-device weights
            return
        qdtype, shape = _weight_shape(quantization_encoding, self.out_dim, self.in_dim, "Linear")
        prefix = f"{name}." if name else ""
        self.weight = Weight(
            prefix + "weight", qdtype or dtype, shape, DeviceRef.CPU(), quantization_encoding=quantization_encoding
        )
        self.bias = Weight(prefix + "bias", dtype, [self.out_dim], DeviceRef.CPU()) if has_bias else None
        if quant_config is not None:
            self.weight, self.weight_scale, self.input_scale = float8_weights(
                quant_config, self.in_dim, self.out_dim, prefix, weight_dtype
            )

    def __call__(self, x: Any) -> Any:
        w = _on(self.weight, self.device)
        if getattr(self, "float8_config", None) is not None:
            scales = [_on(s, self.device) if s is not None else None for s in (self.weight_scale, self.input_scale)]
            out = float8_matmul(self, x, w, *scales)
        elif self.quantization_encoding is not None:
            out = ops.qmatmul(self.quantization_encoding, None, x, w)
        else:
            if self.clip_weight is not None:
                w = clamp(w, -self.clip_weight, self.clip_weight)
            out = x @ w.T
        if self.bias is not None:
            out = out + _on(self.bias, self.device)
        return out

    def shard(self, devices: Iterable[Any]) -> list[Linear]:
        """One `Linear` per device holding its shards of the weight, bias and float8 scales
        (see `maxfx.nn._linear_sharding`; column splits keep the bias on device 0 only)."""
        return shard_linear(self, devices, Linear)

    @property
    def sharding_strategy(self) -> Any:
        """The weight's `ShardingStrategy` (None: not sharded)."""
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: Any) -> None:
        set_linear_strategy(self, strategy)

    def __repr__(self) -> str:
        return (
            f"Linear(in_dim={self.in_dim}, out_dim={self.out_dim}, dtype={self.weight.dtype.name}, "
            f"bias={self.bias is not None})"
        )


_ACTIVATIONS = activation_table(ops)  # the one table of activation names (maxfx.nn.activation)


class MLP(Module, Shardable):
    """Gated feed-forward: ``down(act(gate(x)) * up(x))`` (Llama's MLP).

    Example:
        >>> mlp = MLP(DType.float32, None, 8, 32, [DeviceRef.CPU()])
        >>> sorted(mlp.state_dict())
        ['down_proj.weight', 'gate_proj.weight', 'up_proj.weight']
    """

    def __init__(
        self,
        dtype: DType,
        quantization_encoding: QuantizationEncoding | None,
        hidden_dim: int,
        feed_forward_length: int,
        devices: Sequence[Any],
        linear_cls: Callable[..., Linear] = Linear,
        has_bias: bool = False,
        activation_function: str = "silu",
        float8_config: Any = None,
        dist_gemm_config: Any = None,
    ):
        super().__init__()
        if activation_function not in _ACTIVATIONS:
            raise ValueError(
                f"MLP: activation_function must be one of {sorted(_ACTIVATIONS)}, got {activation_function!r}"
            )
        devices = list(devices) or [DeviceRef.CPU()]
        self.devices = [device_ref(d) for d in devices]
        self.activation_function = activation_function

        def make(i: int, o: int) -> Any:
            return linear_cls(
                i,
                o,
                dtype,
                self.devices[0],
                has_bias=has_bias,
                quantization_encoding=quantization_encoding,
                float8_config=float8_config,
            )

        self.gate_proj = make(hidden_dim, feed_forward_length)
        self.down_proj = make(feed_forward_length, hidden_dim)
        self.up_proj = make(hidden_dim, feed_forward_length)

    def shard(self, devices: Iterable[Any]) -> list[MLP]:
        """One MLP per device (tensor parallel): gate/up split by output rows, down by input columns.

        Each shard computes a partial result; their sum (an allreduce) is the full output.
        """
        devices = list(devices)
        n = len(devices)
        for lin, axis in ((self.gate_proj, 0), (self.up_proj, 0), (self.down_proj, 1)):
            lin.sharding_strategy = ShardingStrategy(n, axis)
        parts = [lin.shard(devices) for lin in (self.gate_proj, self.down_proj, self.up_proj)]
        out = []
        for i, dev in enumerate(devices):
            m = MLP.__new__(MLP)
            Module.__init__(m)
            m.devices, m.activation_function = [device_ref(dev)], self.activation_function
            m.gate_proj, m.down_proj, m.up_proj = parts[0][i], parts[1][i], parts[2][i]
            out.append(m)
        return out

    def __call__(self, x: Any) -> Any:
        act = _ACTIVATIONS[self.activation_function]
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))


class Embedding(Module):
    """Row lookup in ``weight: [vocab_size, hidden_dim]``.

    Example:
        >>> emb = Embedding(100, 8, DType.float32, DeviceRef.CPU())
        >>> list(emb.state_dict())
        ['weight']
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_dim: int,
        dtype: DType,
        device: Any,
        quantization_encoding: QuantizationEncoding | None = None,
        name: str | None = None,
    ):
        super().__init__()
        self.device = device_ref(device)
        self.quantization_encoding = quantization_encoding
        qdtype, shape = _weight_shape(quantization_encoding, int(vocab_size), int(hidden_dim), "Embedding")
        self.weight = Weight(
            name or "weight", qdtype or dtype, shape, DeviceRef.CPU(), quantization_encoding=quantization_encoding
        )

    def __call__(self, indices: Any) -> Any:
        w = _on(self.weight, self.device)
        if self.quantization_encoding is not None:
            w = ops.dequantize(self.quantization_encoding, w)
        return ops.gather(w, indices, axis=0)


class LayerNorm(Module, Shardable):
    """``ops.layer_norm`` over the last dim with ``weight`` (and ``bias`` when ``use_bias``), as MAX's.

    By default the input, weight and bias are cast to float32 and the result
    back to the input's dtype; ``keep_dtype=True`` normalizes in the input's
    dtype. ``elementwise_affine=False`` has no weights (gamma 1, beta 0).

    Example:
        >>> norm = LayerNorm(8, [DeviceRef.CPU()], DType.float32)
        >>> sorted(norm.state_dict())
        ['bias', 'weight']
        >>> list(LayerNorm(8, [DeviceRef.CPU()], DType.float32, elementwise_affine=False).state_dict())
        []
    """

    def __init__(
        self,
        dims: int,
        devices: Sequence[Any],
        dtype: DType,
        eps: float = 1e-5,
        use_bias: bool = True,
        keep_dtype: bool = False,
        elementwise_affine: bool = True,
    ):
        super().__init__()
        self.devices = [device_ref(d) for d in (list(devices) or [DeviceRef.CPU()])]
        self.eps = eps
        self.dims = self.dim = int(dims)
        self.dtype, self.keep_dtype = dtype, bool(keep_dtype)
        self.weight = Weight("weight", dtype, [self.dims], DeviceRef.CPU()) if elementwise_affine else None
        self.bias = Weight("bias", dtype, [self.dims], DeviceRef.CPU()) if elementwise_affine and use_bias else None

    def _param(self, weight: Weight | None, fill: float, device: DeviceRef) -> Any:
        if weight is not None:
            return _on(weight, device)
        return ops.broadcast_to(ops.constant(fill, self.dtype, device), [self.dims])

    def __call__(self, x: Any) -> Any:
        dev = self.devices[0]
        gamma, beta = self._param(self.weight, 1.0, dev), self._param(self.bias, 0.0, dev)
        if self.keep_dtype:
            return ops.layer_norm(x, gamma, beta, self.eps)
        f32 = DType.float32
        return ops.layer_norm(x.cast(f32), gamma.cast(f32), beta.cast(f32), self.eps).cast(x.dtype)


class RMSNorm(Module, Shardable):
    """``x * rsqrt(mean(x², -1) + eps) * (weight + weight_offset)``, computed in float32.

    ``multiply_before_cast=True`` multiplies by the weight before casting back
    to the input dtype (Gemma); ``False`` casts first (Llama).

    Example:
        >>> norm = RMSNorm(8, DType.float32)
        >>> list(norm.state_dict())
        ['weight']
    """

    def __init__(
        self, dim: int, dtype: DType, eps: float = 1e-6, weight_offset: float = 0.0, multiply_before_cast: bool = True
    ):
        super().__init__()
        self.dim, self.eps, self.weight_offset, self.multiply_before_cast = (
            int(dim),
            eps,
            weight_offset,
            multiply_before_cast,
        )
        self.weight = Weight("weight", dtype, [self.dim], DeviceRef.CPU())

    def __call__(self, x: Any) -> Any:
        return ops.rms_norm(x, _on(self.weight, x.device), self.eps, self.weight_offset, self.multiply_before_cast)


class Sequential(LayerList):
    """Applies its layers in order; they are its children ``0``, ``1``, ... (as in MAX).

    So a module holding ``self.layers = Sequential([...])`` names their weights
    ``layers.0.fc1.weight``, the names MAX's docs and checkpoints use.

    Example:
        >>> seq = Sequential([Linear(4, 4, DType.float32, DeviceRef.CPU()), Linear(4, 2, DType.float32,
        ...     DeviceRef.CPU())])
        >>> sorted(seq.state_dict())
        ['0.weight', '1.weight']
        >>> sorted(Sequential([Linear(4, 4, DType.float32, DeviceRef.CPU()), ops.relu, Linear(4, 2, DType.float32,
        ...     DeviceRef.CPU())]).state_dict())
        ['0.weight', '2.weight']
    """

    def __init__(self, layers: Sequence[Layer | Callable[[Any], Any]]):
        super().__init__(layers)

    def __call__(self, x: Any) -> Any:
        for layer in self.layers:  # Modules and plain callables (ops.relu), as in MAX's "Build an MLP block"
            x = layer(x)
        return x
