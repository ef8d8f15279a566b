"""Distributed transformer: the same decoder with every layer split over several devices.

Each `DistributedTransformerBlock` shards its attention (tensor parallel by
heads, summed) and its MLP/norms (`Shardable.shard`), and keeps one residual
stream per device. Inside one compiled program the devices are views of the
program's device, so results equal the single-device model's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import ShardingStrategy
from maxfx.nn._layer import LayerList, Module
from maxfx.nn.attention._rope_attention import distribute_value
from maxfx.nn.transformer._transformer import ReturnLogits

__all__ = [
    "DistributedTransformer",
    "DistributedTransformerBlock",
    "ShardableCallable",
    "distribute_value",
    "forward_sharded_layers",
    "take",
]


@runtime_checkable
class ShardableCallable(Protocol):
    """A layer that can be called and split over devices (``shard(devices)`` and ``sharding_strategy``)."""

    def __call__(self, x: Any) -> Any:
        """Apply the layer."""

    def shard(self, devices: Iterable[DeviceRef]) -> Sequence[Any]:
        """One view of the layer per device."""


def take(it: Iterable[Any], n: int) -> list[Any]:
    """Return the next ``n`` items from ``it`` as a list.

    Example:
        >>> it = iter([1, 2, 3])
        >>> take(it, 2), take(it, 2)
        ([1, 2], [3])
    """
    out = []
    for _ in range(int(n)):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


def forward_sharded_layers(layers: Sequence[Any], xs: Sequence[Any]) -> list[Any]:
    """Apply ``layers[i]`` to ``xs[i]``.

    Raises:
        AssertionError: the number of layers and input tensors don't match.
    """
    assert len(layers) == len(xs), f"forward_sharded_layers: {len(layers)} layers but {len(xs)} inputs"
    return [layer(x) for layer, x in zip(layers, xs)]


def _sum_to_all(parts: list[Any], devices: list[DeviceRef]) -> list[Any]:
    total = parts[0]
    for p in parts[1:]:
        total = total + (p if p.device == total.device else p.to(total.device))
    return distribute_value(total, devices)


def _replicas(layer: Any, devices: list[DeviceRef]) -> list[Any]:
    """Per-device views of a norm: shard() with replication where the layer supports it."""
    shard = getattr(layer, "shard", None)
    if callable(shard) and hasattr(layer, "weight"):
        try:
            layer.weight.sharding_strategy = ShardingStrategy.replicate(len(devices))
            ws = layer.weight.shard(devices)
        except (ValueError, TypeError):
            return [layer] * len(devices)
        views = []
        for w in ws:
            v = type(layer).__new__(type(layer))
            Module.__init__(v)
            for k, val in layer.__dict__.items():
                if not k.startswith("_") and k != "weight":
                    v.__dict__[k] = val
            v.weight = w
            views.append(v)
        return views
    return [layer] * len(devices)


class DistributedTransformerBlock(Module):
    """Stack of Attention, FeedForward, and RMSNorm layers, split over ``devices``.

    Call: ``block(layer_idx, xs, signal_buffers, kv_collections, freqs_cis, input_row_offsets)``
    with per-device lists; returns one residual stream per device.
    """

    def __init__(
        self,
        attention: Module,
        mlp: Any,
        attention_norm: Any,
        mlp_norm: Any,
        devices: Sequence[Any],
        distributed_gemm_config: Any = None,
    ):
        super().__init__()
        self.self_attn, self.mlp = attention, mlp
        self.input_layernorm, self.post_attention_layernorm = attention_norm, mlp_norm
        self.devices = [DeviceRef.from_device(d) for d in devices]
        if not self.devices:
            raise ValueError("DistributedTransformerBlock: devices must not be empty")
        self.distributed_gemm_config = distributed_gemm_config

    def __call__(
        self,
        layer_idx: Any,
        xs: Any,
        signal_buffers: Any,
        kv_collections: Any,
        freqs_cis: Any,
        input_row_offsets: Any,
        **kwargs: Any,
    ) -> list[Any]:
        devs = self.devices
        normed = forward_sharded_layers(_replicas(self.input_layernorm, devs), xs)
        attn = self.self_attn(layer_idx, normed, signal_buffers, kv_collections, freqs_cis, input_row_offsets)
        hs = [x + a for x, a in zip(xs, attn)]
        mlp_in = forward_sharded_layers(_replicas(self.post_attention_layernorm, devs), hs)
        mlp_out = forward_sharded_layers(self.mlp.shard(devs), mlp_in) if len(devs) > 1 else [self.mlp(mlp_in[0])]
        summed = _sum_to_all(mlp_out, devs) if len(devs) > 1 else mlp_out
        return [h + m for h, m in zip(hs, summed)]


class DistributedTransformer(Module):
    """Transformer model consisting for TransformerBlock layers, over several devices.

    Call: ``model(tokens, kv_collections, return_n_logits, input_row_offsets, signal_buffers=None)``
    with ``kv_collections`` one `PagedCacheValues` per device; returns the same
    tuple as `Transformer` (logits from device 0).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        layers: Sequence[Module],
        norm: Any,
        output: Any,
        embedding: Any,
        kv_params: Any,
        devices: Sequence[Any],
        rope: Any,
        return_logits: ReturnLogits = ReturnLogits.LAST_TOKEN,
        use_subgraphs: bool = False,
        subgraph_layer_groups: Any = None,
        logits_scaling: float = 1.0,
    ):
        super().__init__()
        self.dim, self.n_heads = int(dim), int(n_heads)
        self.layers = LayerList(list(layers))
        self.norm, self.lm_head, self.embed_tokens = norm, output, embedding
        self.kv_params, self.rope = kv_params, rope
        self.devices = [DeviceRef.from_device(d) for d in devices]
        self.return_logits = ReturnLogits(return_logits)
        self.use_subgraphs, self.subgraph_layer_groups = bool(use_subgraphs), subgraph_layer_groups
        self.logits_scaling = float(logits_scaling)

    def __call__(
        self,
        tokens: Any,
        kv_collections: Any,
        return_n_logits: Any,
        input_row_offsets: Any,
        signal_buffers: Any = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        devs = self.devices
        if not isinstance(kv_collections, (list, tuple)) or len(kv_collections) != len(devs):
            raise ValueError(
                "DistributedTransformer: kv_collections must be a list with one PagedCacheValues per device "
                f"({len(devs)})"
            )
        h = self.embed_tokens(tokens)
        xs = distribute_value(h, devs)
        freqs = distribute_value(self.rope.freqs_cis, devs)
        offsets = distribute_value(input_row_offsets, devs)
        for i, layer in enumerate(self.layers):
            xs = layer(ops.constant(i, DType.uint32, devs[0]), xs, signal_buffers, list(kv_collections), freqs, offsets)
        h0 = xs[0]
        offs = input_row_offsets.cast(DType.int64)
        last = ops.gather(h0, offs[1:] - 1, axis=0)
        logits = lambda v: self._scale(self.lm_head(self.norm(v)).cast(DType.float32))  # noqa: E731
        if self.return_logits is ReturnLogits.LAST_TOKEN:
            return (logits(last),)
        if self.return_logits is ReturnLogits.ALL:
            return (logits(last), logits(h0), input_row_offsets)
        raise ValueError(
            "DistributedTransformer: ReturnLogits.VARIABLE is supported by Transformer only; use LAST_TOKEN or ALL"
        )

    def _scale(self, v: Any) -> Any:
        return v / self.logits_scaling if self.logits_scaling != 1.0 else v
