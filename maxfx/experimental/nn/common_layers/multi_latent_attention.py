"""``max.experimental.nn.common_layers.multi_latent_attention``: eager multi-latent attention (DeepSeek-V2/V3 MLA).

`LatentAttentionWithRope` projects ragged tokens ``x [total_tokens, hidden]``
to queries (directly, or through the ``q_lora_rank`` bottleneck) and to one
latent row per token: ``kv_lora_rank`` RMS-normalized latent values plus a
``qk_rope_head_dim`` key shared by all heads, rotated by RoPE. The rows are
written into the paged latent cache; attention then runs in the absorbed form
(queries are projected into the latent space by ``W_uk`` from ``kv_b_proj``,
attend over the cached rows, and the result goes through ``W_uv`` and
``o_proj``), which equals decompressing K and V for every head. The kernels are
maxfx's (``rope_ragged``, ``kv_cache_store``, ``flare_mla_decode_ragged``), the
same as the graph-API ``maxfx.nn.attention.LatentAttentionWithRope``.

Devices: the layer runs on one device, on a mesh as data-parallel replicas
(``x`` sharded by tokens, one cache per device), or, after
`tensor_parallel_latent_attention_with_rope`, with its heads split over the
``TP`` axis of a mesh (the output is then a ``Partial`` sum over devices).

Example:
    >>> import numpy as np
    >>> from maxfx.driver import CPU
    >>> from maxfx.dtype import DType
    >>> from maxfx.experimental.sharding import DeviceMesh, PlacementMapping, Replicated
    >>> from maxfx.experimental.tensor import Tensor
    >>> from maxfx.graph import DeviceRef
    >>> from maxfx.nn.kv_cache import MLAKVCacheParams
    >>> params = MLAKVCacheParams(DType.float32, head_dim=8 + 4, num_layers=1, devices=[DeviceRef.CPU()], num_q_heads=2,
    ...     page_size=4)
    >>> attn = LatentAttentionWithRope(num_attention_heads=2, num_key_value_heads=1, hidden_size=16, kv_params=params,
    ...     layer_idx=0,
    ...     kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
    >>> symbols = params.get_symbolic_inputs().inputs[0]
    >>> u32 = DType.uint32
    >>> values = [Tensor.zeros([2, 1, 1, 4, 1, 12]), Tensor.zeros([1], dtype=u32), Tensor(np.array([[0, 1]],
    ...     np.uint32)),
    ...     Tensor.zeros([1], dtype=u32), Tensor.zeros([1], dtype=u32), Tensor.zeros([3],
    ...     dtype=DType.int64), Tensor.zeros([1], dtype=DType.int64)]
    >>> mesh = PlacementMapping(DeviceMesh((CPU(),), (1,), ("x",)), (Replicated(),))
    >>> kv = PagedCacheValues.from_upstream([symbols.unflatten(iter(values))], mesh)
    >>> freqs = Tensor(np.tile([1.0, 0.0], (8, 2)).astype(np.float32))  # [max_seq_len, qk_rope_head_dim]: no rotation
    >>> out = attn(Tensor.ones([3, 16]), kv, freqs, Tensor(np.array([0, 3], np.uint32)))
    >>> list(map(int, out.shape))
    [3, 16]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowering.dtypes import DType
from maxfx.driver import Device
from maxfx.experimental import functional as F
from maxfx.experimental.nn._layers import Linear
from maxfx.experimental.nn.common_layers.kv_cache import PagedCacheValues
from maxfx.experimental.nn.common_layers.mesh_axis import TP
from maxfx.experimental.nn.module import Module
from maxfx.experimental.nn.norm.rms_norm import RMSNorm
from maxfx.experimental.sharding import (
    DeviceMapping,
    DeviceMesh,
    DistributedTensor,
    Partial,
    PlacementMapping,
    Replicated,
    Sharded,
    distribute,
    from_shards,
)
from maxfx.experimental.tensor import Tensor
from maxfx.nn.attention.mask_config import MHAMaskVariant
from maxfx.nn.kernels import flare_mla_prefill_plan
from maxfx.nn.kernels._attention import check_mla_settings, mla_absorbed_attention
from maxfx.nn.kv_cache._paged import PagedCacheValues as _GraphPagedCacheValues
from maxfx.nn.kv_cache._params import KVCacheParams

# The graph-API kernel makes constants of its own: F.functional gives it the eager context (one realization per call).
_prefill_plan = F.functional(flare_mla_prefill_plan)

__all__ = [
    "LatentAttentionWithRope",
    "MLAPrefillMetadata",
    "tensor_parallel_latent_attention_with_rope",
]

# How `tensor_parallel_latent_attention_with_rope` lays out each weight over the TP axis.
_REPLICATED, _ROWWISE, _COLUMNWISE = "replicated", "rowwise", "columnwise"


@dataclass
class MLAPrefillMetadata:
    """The prefill plan of `LatentAttentionWithRope.create_mla_prefill_metadata`.

    Attributes:
        buffer_row_offsets: uint32 ``[chunks, batch + 1]``: rows of each sequence's keys in a chunk.
        cache_offsets: uint32 ``[chunks, batch]``: each sequence's first cache position in a chunk.
        buffer_lengths: int32 ``[chunks]``: rows in each chunk.
    """

    buffer_row_offsets: Tensor
    cache_offsets: Tensor
    buffer_lengths: Tensor


def _dims(t: Any) -> list[Any]:
    return [int(d) if str(d).isdigit() else str(d) for d in t.shape]


def _desc(t: Any) -> str:
    """``float32[5, 7]`` for a tensor, else its type's name."""
    return f"{t.dtype.name}{_dims(t)}" if isinstance(t, Tensor) else type(t).__name__


def _local(t: Any, i: int, device: Device) -> Tensor:
    """Device ``i``'s piece of ``t``: a distributed tensor's shard ``i``, else ``t`` on ``device``."""
    if isinstance(t, DistributedTensor):
        return t.local_shards[i]
    return t if t.device == device else t.to(device)


class LatentAttentionWithRope(Module):
    """Multi-latent attention with RoPE over the paged latent cache (MAX's ModuleV3 layer).

    Call: ``attn(x, kv_collection, freqs_cis, input_row_offsets)`` with ragged
    ``x [total_tokens, hidden_size]``, the cache as a `PagedCacheValues`
    (``max.experimental.nn.common_layers.kv_cache``), ``freqs_cis
    [max_seq_len, qk_rope_head_dim]`` (``(cos, sin)`` pairs, interleaved
    rotation) and uint32 ``input_row_offsets [batch + 1]``; token ``i`` of
    sequence ``b`` is at position ``cache_lengths[b] + i``. Returns
    ``[total_tokens, hidden_size]``.

    Args:
        num_attention_heads: query heads.
        num_key_value_heads: KV heads (MLA caches one latent row per token; kept for MAX's signature).
        hidden_size: width of ``x`` and of the output.
        kv_params: the latent cache's parameters (``is_mla``, ``head_dim = kv_lora_rank + qk_rope_head_dim``).
        layer_idx: this layer's slot in the cache.
        scale: attention scale (default ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``).
        q_lora_rank: width of the query bottleneck (``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``), or None for
        ``q_proj``.
        kv_lora_rank: width of the cached latent.
        qk_nope_head_dim: per-head query/key width without RoPE.
        qk_rope_head_dim: per-head query/key width with RoPE (the shared key's width).
        v_head_dim: per-head value width.
        buffer_size: tokens per chunk of the prefill plan (`create_mla_prefill_metadata`).
        graph_mode: ``"prefill"``, ``"decode"`` or ``"auto"`` (None: ``"auto"``). maxfx runs the
            same absorbed attention in every mode; the mode is kept for MAX's API.

    Weights (MAX's names and shapes): ``q_proj [H * qk_head_dim, hidden]`` or ``q_a_proj
    [q_lora_rank, hidden]``, ``q_a_layernorm`` (RMSNorm), ``q_b_proj [H * qk_head_dim, q_lora_rank]``;
    ``kv_a_proj_with_mqa [kv_lora_rank + qk_rope_head_dim, hidden]``, ``kv_a_proj_layernorm
    [kv_lora_rank]``, ``kv_b_proj [H * (qk_nope_head_dim + v_head_dim), kv_lora_rank]``, ``o_proj``
    (Linear ``H * v_head_dim`` → ``hidden``, no bias).

    Raises:
        ValueError: a bad ``graph_mode``, non-positive sizes, or ``kv_params`` that is not an MLA cache
            of ``kv_lora_rank + qk_rope_head_dim`` columns.

    Example:
        >>> attn = LatentAttentionWithRope(num_attention_heads=8, num_key_value_heads=1, hidden_size=256,
        ...      # doctest: +SKIP
        ...     kv_params=params, layer_idx=0, q_lora_rank=32, kv_lora_rank=64, qk_nope_head_dim=32,
        ...     qk_rope_head_dim=16, v_head_dim=32)
        >>> out = attn(x, kv_collection, freqs_cis, input_row_offsets)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        layer_idx: int,
        scale: float | None = None,
        q_lora_rank: int | None = None,
        kv_lora_rank: int = 512,
        qk_nope_head_dim: int = 128,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 128,
        buffer_size: int = 16384,
        graph_mode: str | None = None,
    ) -> None:
        name = type(self).__name__
        sizes = dict(
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            hidden_size=hidden_size,
            kv_lora_rank=kv_lora_rank,
            qk_nope_head_dim=qk_nope_head_dim,
            qk_rope_head_dim=qk_rope_head_dim,
            v_head_dim=v_head_dim,
            buffer_size=buffer_size,
        )
        if q_lora_rank is not None:
            sizes["q_lora_rank"] = q_lora_rank
        for key, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {key} must be a positive int, got {value!r}")
        mode = check_mla_settings(name, kv_params, kv_lora_rank, qk_rope_head_dim, graph_mode)
        if int(layer_idx) < 0:
            raise ValueError(f"{name}: layer_idx must be >= 0, got {layer_idx}")
        self.graph_mode = mode
        self.n_heads, self.num_key_value_heads, self.hidden_size = num_attention_heads, num_key_value_heads, hidden_size
        self.kv_params, self.layer_idx = kv_params, int(layer_idx)
        self.q_lora_rank, self.kv_lora_rank = q_lora_rank, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.cache_head_dim = kv_lora_rank + qk_rope_head_dim
        self.BUFFER_TOK_SIZE = buffer_size
        self.scale = float(scale) if scale is not None else math.sqrt(1.0 / self.qk_head_dim)
        if q_lora_rank is not None:
            self.q_a_proj = Tensor.zeros([q_lora_rank, hidden_size])
            self.q_a_layernorm = RMSNorm(dim=q_lora_rank, eps=1e-6)
            self.q_b_proj = Tensor.zeros([self.n_heads * self.qk_head_dim, q_lora_rank])
        else:
            self.q_proj = Tensor.zeros([self.n_heads * self.qk_head_dim, hidden_size])
        self.kv_a_proj_layernorm = Tensor.ones([kv_lora_rank])
        self.kv_a_proj_with_mqa = Tensor.zeros([self.cache_head_dim, hidden_size])
        self.kv_b_proj = Tensor.zeros([self.n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank])
        self.o_proj = Linear(in_dim=self.n_heads * v_head_dim, out_dim=hidden_size, bias=False)
        self._layout: tuple[tuple[str, str], ...] = ()  # set by tensor_parallel_latent_attention_with_rope
        self._mesh: DeviceMesh | None = None  # set by .to(a mesh of several devices)

    # -- derived weights (MAX's) ----------------------------------------------
    @property
    def _kv_b_proj_weight(self) -> Tensor:
        """``kv_b_proj`` as ``[kv_lora_rank, n_heads, qk_nope_head_dim + v_head_dim]``."""
        return self.kv_b_proj.T.reshape([self.kv_lora_rank, -1, self.qk_nope_head_dim + self.v_head_dim])

    @property
    def w_uk(self) -> Tensor:
        """Query absorption weights ``[n_heads, kv_lora_rank, qk_nope_head_dim]``."""
        return self._kv_b_proj_weight[..., : self.qk_nope_head_dim].transpose(0, 1)

    @property
    def w_uv(self) -> Tensor:
        """Value up-projection weights ``[n_heads, v_head_dim, kv_lora_rank]``."""
        return self._kv_b_proj_weight[..., self.qk_nope_head_dim :].permute([1, 2, 0])

    @property
    def w_k(self) -> Tensor:
        """Key up-projection weights ``[n_heads * qk_nope_head_dim, kv_lora_rank]``."""
        return self._kv_b_proj_weight[..., : self.qk_nope_head_dim].permute([1, 2, 0]).reshape([-1, self.kv_lora_rank])

    @property
    def wqkv(self) -> Tensor:
        """``q_a_proj`` (or ``q_proj``) stacked on ``kv_a_proj_with_mqa``: one matmul gives queries and latent rows."""
        q = self.q_a_proj if self.q_lora_rank is not None else self.q_proj
        return F.concat([q, self.kv_a_proj_with_mqa])

    # -- placement --------------------------------------------------------------
    def to(self, target: Any) -> LatentAttentionWithRope:
        """Move to a device, or lay the weights out over a one-axis mesh (a `DeviceMesh` or a mapping on one).

        On a mesh the weights are replicated (data-parallel replicas), except, after
        `tensor_parallel_latent_attention_with_rope` and on a mesh whose axis is ``TP``,
        the head-split weights (rowwise ``q_b_proj``/``q_proj``/``kv_b_proj``, columnwise ``o_proj``).

        Raises:
            ValueError: a mesh with several axes, or heads that do not split evenly over the TP devices.
        """
        name = type(self).__name__
        mesh = target.mesh if isinstance(target, DeviceMapping) else target if isinstance(target, DeviceMesh) else None
        if mesh is None or mesh.num_devices == 1:
            self._mesh = None
            return Module.to(self, mesh.devices[0] if mesh is not None else target)
        if mesh.ndim != 1:
            raise ValueError(f"{name}.to: the mesh must have one axis (data or tensor parallel), got {mesh}")
        n = mesh.num_devices
        tensor_parallel = self._is_tensor_parallel(mesh)
        if tensor_parallel and self.n_heads % n:
            raise ValueError(
                f"{name}.to: {self.n_heads} attention heads do not split evenly over the {n} devices of {mesh}"
            )
        layout = dict(self._layout) if tensor_parallel else {}
        placements = {_ROWWISE: Sharded(0), _COLUMNWISE: Sharded(1)}

        def place(param: str, t: Tensor) -> Tensor:
            return distribute(
                t, PlacementMapping(mesh, (placements.get(layout.get(param, _REPLICATED), Replicated()),))
            )

        self.apply_to_parameters(place)
        self._mesh = mesh
        return self

    def _is_tensor_parallel(self, mesh: DeviceMesh | None) -> bool:
        return bool(self._layout) and mesh is not None and mesh.num_devices > 1 and tuple(mesh.axis_names) == (TP,)

    # -- prefill plan -------------------------------------------------------------
    def create_mla_prefill_metadata(
        self, input_row_offsets: Tensor, kv_collection: PagedCacheValues
    ) -> MLAPrefillMetadata:
        """The one-chunk prefill plan (``flare_mla_prefill_plan`` with ``buffer_size`` tokens per chunk).

        maxfx's absorbed attention reads the cache directly, so `forward` does not need
        the plan; it is built for callers that share it between layers, as in MAX.
        """
        kv = self._collection(kv_collection)
        parts = []
        for i in range(kv.n_devices):
            local = kv.for_device(i)
            dev = local.cache_lengths.device
            offsets = _local(input_row_offsets, i, dev)
            parts.append(
                _prefill_plan(
                    self.kv_params, offsets, self._graph_collection(local), 0, self.BUFFER_TOK_SIZE, max_chunks=1
                )
            )
        if kv.n_devices == 1 and not isinstance(input_row_offsets, DistributedTensor):
            return MLAPrefillMetadata(*parts[0])
        mapping = PlacementMapping(kv.kv_blocks.mesh, (Replicated(),))
        return MLAPrefillMetadata(*(from_shards([p[k] for p in parts], mapping) for k in range(3)))

    # -- forward -------------------------------------------------------------------
    def _collection(self, kv_collection: Any) -> PagedCacheValues:
        if not isinstance(kv_collection, PagedCacheValues):
            raise TypeError(
                f"{type(self).__name__}: kv_collection must be a "
                "max.experimental.nn.common_layers.kv_cache.PagedCacheValues (PagedCacheValues.from_upstream), got "
                f"{type(kv_collection).__name__}"
            )
        return kv_collection

    @staticmethod
    def _graph_collection(local: Any) -> _GraphPagedCacheValues:
        return local if isinstance(local, _GraphPagedCacheValues) else _GraphPagedCacheValues(**vars(local))

    def _check_inputs(self, x: Tensor, freqs_cis: Tensor, input_row_offsets: Tensor, kv: PagedCacheValues) -> None:
        name = type(self).__name__
        if not isinstance(x, Tensor) or x.rank != 2 or str(x.shape[1]) != str(self.hidden_size):
            raise ValueError(f"{name}: x must be ragged [total_tokens, hidden_size={self.hidden_size}], got {_desc(x)}")
        if (
            not isinstance(freqs_cis, Tensor)
            or freqs_cis.rank != 2
            or str(freqs_cis.shape[1]) != str(self.qk_rope_head_dim)
        ):
            raise ValueError(
                f"{name}: freqs_cis must be [max_seq_len, qk_rope_head_dim={self.qk_rope_head_dim}], got "
                f"{_desc(freqs_cis)}"
            )
        if (
            not isinstance(input_row_offsets, Tensor)
            or input_row_offsets.rank != 1
            or not input_row_offsets.dtype.is_integral()
        ):
            raise ValueError(
                f"{name}: input_row_offsets must be an integer [batch + 1] tensor, got {_desc(input_row_offsets)}"
            )
        blocks = kv.kv_blocks
        if blocks.rank != 6 or str(blocks.shape[-1]) != str(self.cache_head_dim):
            raise ValueError(
                f"{name}: the cache's blocks must be [pages, 1, layers, page_size, 1, {self.cache_head_dim}] "
                f"(kv_lora_rank + qk_rope_head_dim), got {_dims(blocks)}"
            )
        if self.layer_idx >= int(blocks.shape[2]):
            raise ValueError(
                f"{name}: layer_idx {self.layer_idx} is out of range for a cache of {int(blocks.shape[2])} layers"
            )

    def forward(
        self,
        x: Tensor,
        kv_collection: PagedCacheValues,
        freqs_cis: Tensor,
        input_row_offsets: Tensor,
        mla_prefill_metadata: MLAPrefillMetadata | None = None,
    ) -> Tensor:
        """Attention output ``[total_tokens, hidden_size]``; this step's latent rows are written into the cache.

        Raises:
            TypeError: ``kv_collection`` is not a `PagedCacheValues`.
            ValueError: inputs of the wrong shapes, or devices that do not match the layer's layout.
        """
        name = type(self).__name__
        kv = self._collection(kv_collection)
        self._check_inputs(x, freqs_cis, input_row_offsets, kv)
        if mla_prefill_metadata is not None and not isinstance(mla_prefill_metadata, MLAPrefillMetadata):
            raise TypeError(
                f"{name}: mla_prefill_metadata must be an MLAPrefillMetadata, got {type(mla_prefill_metadata).__name__}"
            )
        x_mesh = x.mesh if isinstance(x, DistributedTensor) else None
        n = x_mesh.num_devices if x_mesh is not None else 1
        if kv.n_devices != n:
            raise ValueError(
                f"{name}: the KV cache is on {kv.n_devices} device(s) but x is on {n}; pass one cache per device of "
                "x's mesh"
            )
        if n == 1:
            dev = x.local_shards[0].device if x_mesh is not None else x.device
            local_x = x.local_shards[0] if x_mesh is not None else x
            out = self._device_forward(0, dev, local_x, kv, freqs_cis, input_row_offsets, self.n_heads)
            return from_shards([out], x.mapping) if x_mesh is not None else out
        if self._is_tensor_parallel(self._mesh):
            if x_mesh != self._mesh or not x.mapping.is_fully_replicated:
                raise ValueError(
                    f"{name}: tensor-parallel attention needs x replicated over {self._mesh}, got {x.mapping}"
                )
            heads = self.n_heads // n
            outs = [
                self._device_forward(i, d, x.local_shards[i], kv, freqs_cis, input_row_offsets, heads)
                for i, d in enumerate(x_mesh.devices)
            ]
            return from_shards(outs, PlacementMapping(x_mesh, (Partial(),)))
        # Data parallel: every device runs the whole layer on its tokens and its cache.
        if self._mesh is not None and self._mesh != x_mesh:
            raise ValueError(f"{name}: the layer is laid out over {self._mesh} but x is on {x_mesh}")
        outs = [
            self._device_forward(i, d, x.local_shards[i], kv, freqs_cis, input_row_offsets, self.n_heads)
            for i, d in enumerate(x_mesh.devices)
        ]
        return from_shards(outs, x.mapping)

    def _device_forward(
        self,
        i: int,
        dev: Device,
        x: Tensor,
        kv: PagedCacheValues,
        freqs_cis: Tensor,
        input_row_offsets: Tensor,
        n_heads: int,
    ) -> Tensor:
        """The layer on device ``i`` with its ``n_heads`` heads (all, or its tensor-parallel share)."""
        w: Callable[[Any], Tensor] = lambda t: _local(t, i, dev)  # noqa: E731
        cache = self._graph_collection(kv.for_device(i))
        offsets, freqs = _local(input_row_offsets, i, dev), _local(freqs_cis, i, dev)
        if offsets.dtype != DType.uint32:
            offsets = offsets.cast(DType.uint32)
        if self.q_lora_rank is not None:
            qkv = x @ F.concat([w(self.q_a_proj), w(self.kv_a_proj_with_mqa)]).T
            q_lat, latent_kv = qkv[:, : self.q_lora_rank], qkv[:, self.q_lora_rank :]
            norm = self.q_a_layernorm
            xq = F.rms_norm(q_lat, w(norm.weight), norm.eps) @ w(self.q_b_proj).T
        else:
            xq = x @ w(self.q_proj).T
            latent_kv = x @ w(self.kv_a_proj_with_mqa).T
        xq = xq.reshape([-1, n_heads, self.qk_head_dim])
        attn = self._latent_attention(
            xq, latent_kv, cache, offsets, freqs, w(self.kv_a_proj_layernorm), w(self.kv_b_proj), n_heads
        )
        return attn @ w(self.o_proj.weight).T

    def _latent_attention(
        self,
        xq: Tensor,
        latent_kv: Tensor,
        cache: Any,
        offsets: Tensor,
        freqs: Tensor,
        gamma: Tensor,
        kv_b_proj: Tensor,
        n_heads: int,
    ) -> Tensor:
        """Cache this step's latent rows, attend in the latent space, up-project the values: ``[tokens, n_heads *
        v_head_dim]``.
        """
        rank, dev = self.kv_lora_rank, xq.device
        layer = F.constant(self.layer_idx, DType.uint32, device=dev)
        zero = F.constant(0, DType.uint32, device=dev)
        latent = F.rms_norm(latent_kv[:, :rank], gamma, 1e-6)
        return mla_absorbed_attention(
            self.kv_params,
            xq,
            latent,
            latent_kv[:, rank:],
            kv_b_proj,
            freqs,
            offsets,
            cache,
            layer,
            zero,
            MHAMaskVariant.CAUSAL_MASK,
            self.scale,
            n_heads=n_heads,
            qk_nope_head_dim=self.qk_nope_head_dim,
            v_head_dim=self.v_head_dim,
            q_dtype=cache.kv_blocks.dtype,
            out_dtype=kv_b_proj.dtype,
        )


# ─── tensor parallelism ──────────────────────────────────────────────────────


def tensor_parallel_latent_attention_with_rope(layer: LatentAttentionWithRope) -> LatentAttentionWithRope:
    """Make ``layer`` tensor parallel along the ``TP`` mesh axis (in place; returns it).

    After ``.to(mesh)`` with ``mesh.axis_names == (TP,)``, device ``i`` holds heads
    ``i * H/n ... (i+1) * H/n - 1``: rows of ``q_b_proj`` (or ``q_proj``) and ``kv_b_proj``,
    columns of ``o_proj``; the query bottleneck, ``kv_a_proj_with_mqa`` and the norms are
    replicated, as is the latent cache. The output is a ``Partial`` sum over the devices.

    Raises:
        TypeError: ``layer`` is not a `LatentAttentionWithRope`.

    Example:
        >>> layer = tensor_parallel_latent_attention_with_rope(LatentAttentionWithRope(...)).to(mesh)  # doctest: +SKIP
    """
    if not isinstance(layer, LatentAttentionWithRope):
        raise TypeError(
            "tensor_parallel_latent_attention_with_rope: expected a LatentAttentionWithRope, got "
            f"{type(layer).__name__}"
        )
    layout = {
        "kv_a_proj_layernorm": _REPLICATED,
        "kv_a_proj_with_mqa": _REPLICATED,
        "kv_b_proj": _ROWWISE,
        "o_proj.weight": _COLUMNWISE,
    }
    if layer.q_lora_rank is not None:
        layout.update({"q_a_proj": _REPLICATED, "q_a_layernorm.weight": _REPLICATED, "q_b_proj": _ROWWISE})
    else:
        layout["q_proj"] = _ROWWISE
    layer._layout = tuple(sorted(layout.items()))
    return layer
