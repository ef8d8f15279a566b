"""``max.nn.moe``: Mixture of Experts layers (`MoEGate`, `MoE`, `MoEFp8`).

Each token's hidden state goes to its ``num_experts_per_token`` best experts
(the gate's softmax over expert logits, top-k), each expert is a gated MLP
``down(silu(gate(x)) * up(x))``, and the expert outputs are summed weighted by
the router probabilities. The experts run as two grouped matmuls over the
tokens sorted by expert (`maxfx.nn._moe_math.routed_experts`, shared with the
eager MoE), not one matmul per expert.

Example:
    >>> from maxfx import nn
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph import DeviceRef
    >>> moe = nn.MoE([DeviceRef.CPU()], hidden_dim=8, num_experts=4, num_experts_per_token=2, moe_dim=16,
    ...     dtype=DType.float32)
    >>> sorted(moe.state_dict())[:3]
    ['experts.0.down_proj.weight', 'experts.0.gate_proj.weight', 'experts.0.up_proj.weight']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import ShardingStrategy
from maxfx.nn._basic import MLP, Linear
from maxfx.nn._graph_util import on_device as _on
from maxfx.nn._layer import LayerList, Module, Shardable
from maxfx.nn._moe_math import routed_experts
from maxfx.nn.float8_config import Float8Config
from maxfx.nn.kernels._moe import grouped_matmul_ragged

__all__ = ["MoE", "MoEFp8", "MoEGate"]


def _devices(devices: Sequence[Any]) -> list[DeviceRef]:
    devs = [DeviceRef.from_device(d) for d in (list(devices) or [DeviceRef.CPU()])]
    return devs


class MoEGate(Module, Shardable):
    """Router: ``softmax(x @ gate_score.T)`` over experts, then the top ``num_experts_per_token``.

    Returns ``(topk_indices int64 [tokens, k], topk_weights float32 [tokens, k])``
    (weights are the softmax probabilities, not renormalized over the k).

    Example:
        >>> gate = MoEGate([DeviceRef.CPU()], 8, 4, 2, DType.float32)
        >>> list(gate.state_dict())
        ['gate_score.weight']
    """

    def __init__(
        self, devices: Sequence[Any], hidden_dim: int, num_experts: int, num_experts_per_token: int, dtype: DType
    ):
        super().__init__()
        if not 0 < num_experts_per_token <= num_experts:
            raise ValueError(
                f"MoEGate: num_experts_per_token must be in [1, num_experts={num_experts}], got {num_experts_per_token}"
            )
        self.devices = _devices(devices)
        self.hidden_dim, self.num_experts, self.num_experts_per_token = (
            int(hidden_dim),
            int(num_experts),
            int(num_experts_per_token),
        )
        self.gate_score = Linear(hidden_dim, num_experts, dtype, self.devices[0])

    def __call__(self, hidden_state: Any) -> tuple[Any, Any]:
        probs = ops.softmax(self.gate_score(hidden_state).cast(DType.float32))
        weights, indices = ops.top_k(probs, self.num_experts_per_token, -1)
        return indices, weights

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """How the router splits over devices (it is replicated)."""
        return self.__dict__.get("_sharding_strategy")

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not strategy.is_replicate:
            raise ValueError("MoEGate: the router is small; only ShardingStrategy.replicate(n) is supported")
        self.__dict__["_sharding_strategy"] = strategy
        self.gate_score.sharding_strategy = strategy

    def shard(self, devices: Iterable[Any]) -> list[MoEGate]:
        """One replicated router per device."""
        devices = list(devices)
        if self.sharding_strategy is None:
            raise ValueError("MoEGate.shard: set sharding_strategy first (ShardingStrategy.replicate(n))")
        out = []
        for lin, dev in zip(self.gate_score.shard(devices), devices):
            g = MoEGate.__new__(MoEGate)
            Module.__init__(g)
            g.devices, g.hidden_dim, g.num_experts, g.num_experts_per_token = (
                [DeviceRef.from_device(dev)],
                self.hidden_dim,
                self.num_experts,
                self.num_experts_per_token,
            )
            g.gate_score = lin
            out.append(g)
        return out


class MoE(Module, Shardable):
    """Mixture of Experts over ``hidden_state [tokens, hidden_dim]``.

    ``experts`` holds ``num_experts / ep_size`` gated MLPs (``moe_dim`` wide);
    with ``has_shared_experts`` a ``shared_experts`` MLP (``shared_experts_dim``
    wide) is added to every token. ``apply_router_weight_first`` scales the
    expert inputs by the router weight instead of the outputs.

    Expert parallelism (``ep_size > 1``) needs MAX's multi-GPU EPBatchManager,
    which maxfx does not provide; tensor parallelism is `shard`.

    Example:
        >>> moe = MoE([DeviceRef.CPU()], 8, 4, 2, 16, dtype=DType.float32, has_shared_experts=True,
        ...     shared_experts_dim=8)
        >>> moe.gate_up_proj  # inside a Graph: [4, 32, 8]  # doctest: +SKIP
    """

    def __init__(
        self,
        devices: Sequence[Any],
        hidden_dim: int,
        num_experts: int,
        num_experts_per_token: int,
        moe_dim: int,
        gate_cls: Callable[..., MoEGate] = MoEGate,
        has_shared_experts: bool = False,
        shared_experts_dim: int = 0,
        ep_size: int = 1,
        dtype: DType = DType.bfloat16,
        apply_router_weight_first: bool = False,
        ep_batch_manager: Any = None,
        float8_config: Float8Config | None = None,
    ):
        super().__init__()
        if ep_size != 1 and ep_batch_manager is None:
            raise ValueError(
                f"{type(self).__name__}: ep_size={ep_size} (expert parallelism) needs an EPBatchManager for multi-GPU "
                "token dispatch, which maxfx does not provide; use ep_size=1 and shard() for tensor parallelism"
            )
        if ep_size <= 0 or num_experts % ep_size:
            raise ValueError(f"{type(self).__name__}: ep_size={ep_size} must divide num_experts={num_experts}")
        if has_shared_experts and shared_experts_dim <= 0:
            raise ValueError(
                f"{type(self).__name__}: has_shared_experts needs shared_experts_dim > 0, got {shared_experts_dim}"
            )
        self.devices = _devices(devices)
        self.hidden_dim, self.num_experts, self.num_experts_per_token, self.moe_dim = (
            int(hidden_dim),
            int(num_experts),
            int(num_experts_per_token),
            int(moe_dim),
        )
        self.gate_cls, self.has_shared_experts, self.shared_experts_dim = (
            gate_cls,
            has_shared_experts,
            int(shared_experts_dim),
        )
        self.ep_size, self.dtype, self.apply_router_weight_first = int(ep_size), dtype, apply_router_weight_first
        self.float8_config = float8_config
        self.__dict__["_ep_batch_manager"] = ep_batch_manager
        self.num_local_experts = self.num_experts // self.ep_size
        self.gate = gate_cls(
            devices=self.devices,
            hidden_dim=hidden_dim,
            num_experts=num_experts,
            num_experts_per_token=num_experts_per_token,
            dtype=dtype,
        )
        make = lambda width: MLP(dtype, None, hidden_dim, width, self.devices, float8_config=float8_config)  # noqa: E731
        self.experts = LayerList([make(self.moe_dim) for _ in range(self.num_local_experts)])
        if has_shared_experts:
            self.shared_experts = make(self.shared_experts_dim)

    @property
    def ep_batch_manager(self) -> Any:
        """The expert-parallel batch manager given at construction.

        Raises:
            ValueError: none was given (``ep_size == 1``: no expert parallelism).
        """
        manager = self.__dict__.get("_ep_batch_manager")
        if manager is None:
            raise ValueError(
                f"{type(self).__name__}.ep_batch_manager: this layer has no expert parallelism (ep_size=1, no "
                "EPBatchManager given)"
            )
        return manager

    @property
    def gate_up_proj(self) -> Any:
        """Every expert's gate rows then up rows: ``[num_local_experts, 2 * moe_dim, hidden_dim]``."""
        dev = self.devices[0]
        rows = [_on(w, dev) for e in self.experts for w in (e.gate_proj.weight, e.up_proj.weight)]
        return ops.stack(rows, axis=0).reshape([self.num_local_experts, -1, self.hidden_dim])

    @property
    def down_proj(self) -> Any:
        """Every expert's down projection: ``[num_local_experts, hidden_dim, moe_dim]``."""
        return ops.stack([_on(e.down_proj.weight, self.devices[0]) for e in self.experts], axis=0)

    def _expert_matmul(self, x: Any, which: str, groups: tuple[Any, Any, Any]) -> Any:
        weight = self.gate_up_proj if which == "gate_up" else self.down_proj
        return grouped_matmul_ragged(x, weight, *groups)

    def __call__(self, hidden_state: Any) -> Any:
        if hidden_state.rank != 2 or hidden_state.shape[1] != self.hidden_dim:
            raise ValueError(
                f"{type(self).__name__}: hidden_state must be [tokens, {self.hidden_dim}], got "
                f"{hidden_state.dtype.name}{list(hidden_state.shape)}"
            )
        topk_idx, topk_w = self.gate(hidden_state)
        out = routed_experts(
            hidden_state,
            topk_idx,
            topk_w,
            self.num_local_experts,
            self._expert_matmul,
            moe_dim=self.moe_dim,
            host=DeviceRef.CPU(),
            apply_router_weight_first=self.apply_router_weight_first,
            sum_dtype=DType.float32,  # the router's probabilities weight the expert outputs in float32
        )
        if self.has_shared_experts:
            out = out + self.shared_experts(hidden_state)
        return out

    # ─── tensor parallelism ───────────────────────────────────────────────

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """The tensor-parallel strategy set on this layer (None: not sharded)."""
        return self.__dict__.get("_sharding_strategy")

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if strategy.is_replicate:
            raise ValueError(
                f"{type(self).__name__}: only tensor-parallel sharding (ShardingStrategy.rowwise(n)) is supported"
            )
        self.__dict__["_sharding_strategy"] = strategy

    def shard(self, devices: Iterable[Any]) -> list[MoE]:
        """Tensor-parallel shards: each holds ``moe_dim / n`` of every expert (and of the shared experts).

        The router is replicated; the shards' outputs sum to the full output.
        """
        devices = list(devices)
        strategy = self.sharding_strategy
        if strategy is None:
            raise ValueError(f"{type(self).__name__}.shard: set sharding_strategy first (ShardingStrategy.rowwise(n))")
        n = strategy.num_devices
        if self.moe_dim % n or (self.has_shared_experts and self.shared_experts_dim % n):
            raise ValueError(
                f"{type(self).__name__}.shard: moe_dim {self.moe_dim} and shared_experts_dim {self.shared_experts_dim} "
                f"must divide over {n} devices"
            )
        self.gate.sharding_strategy = ShardingStrategy.replicate(n)
        gates = self.gate.shard(devices)
        experts = [e.shard(devices) for e in self.experts]
        shared = self.shared_experts.shard(devices) if self.has_shared_experts else None
        out = []
        for i, dev in enumerate(devices):
            m = type(self).__new__(type(self))
            Module.__init__(m)
            for key in (
                "hidden_dim",
                "num_experts",
                "num_experts_per_token",
                "gate_cls",
                "has_shared_experts",
                "ep_size",
                "dtype",
                "apply_router_weight_first",
                "float8_config",
                "num_local_experts",
            ):
                setattr(m, key, getattr(self, key))
            m.__dict__["_ep_batch_manager"] = self.__dict__.get("_ep_batch_manager")
            m.devices, m.moe_dim, m.shared_experts_dim = (
                [DeviceRef.from_device(dev)],
                self.moe_dim // n,
                self.shared_experts_dim // n,
            )
            m.gate = gates[i]
            m.experts = LayerList([parts[i] for parts in experts])
            if shared is not None:
                m.shared_experts = shared[i]
            out.append(m)
        return out


def _row_scales(scale: Any, rows: int) -> Any:
    """A per-tensor scale as per-row scales so gate and up scales can be concatenated."""
    return ops.broadcast_to(scale.reshape([1, 1]), [rows, 1]) if scale.rank == 0 else scale


class MoEFp8(MoE):
    """`MoE` whose experts hold float8_e4m3fn weights with scales (``float8_config`` required).

    Tokens are quantized dynamically (per token or per block, as the config's
    input spec says) and the experts run as grouped scaled matmuls.

    Example:
        >>> from maxfx.nn.float8_config import Float8Config  # doctest: +SKIP
        >>> moe = MoEFp8([DeviceRef.CPU()], 8, 4, 2, 16, dtype=DType.float32, float8_config=cfg)  # doctest: +SKIP
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.float8_config
        if cfg is None:
            raise ValueError("MoEFp8: float8_config is required")
        if not cfg.is_dynamic or cfg.input_scale.is_rowwise:
            raise ValueError(
                "MoEFp8: expert activations are quantized dynamically per tensor, token or block; static or "
                "per-channel input scales are not supported"
            )
        bs = cfg.weight_scale.block_size
        if cfg.weight_scale.is_block and self.moe_dim % bs[0]:  # type: ignore[index]
            raise ValueError(f"MoEFp8: moe_dim {self.moe_dim} must be a multiple of the weight block rows {bs[0]}")  # type: ignore[index]

    @property
    def gate_up_proj_scales(self) -> Any:
        """Scales of `gate_up_proj`: ``[num_local_experts, 2 * moe_dim / block_rows, *]``."""
        dev = self.devices[0]
        per_expert = [
            ops.concat(
                [
                    _row_scales(_on(e.gate_proj.weight_scale, dev), self.moe_dim),
                    _row_scales(_on(e.up_proj.weight_scale, dev), self.moe_dim),
                ],
                axis=0,
            )
            for e in self.experts
        ]
        return ops.stack(per_expert, axis=0)

    @property
    def down_proj_scales(self) -> Any:
        """Scales of `down_proj`: ``[num_local_experts, hidden_dim / block_rows, *]``."""
        dev = self.devices[0]
        return ops.stack(
            [_row_scales(_on(e.down_proj.weight_scale, dev), self.hidden_dim) for e in self.experts], axis=0
        )

    def _expert_matmul(self, x: Any, which: str, groups: tuple[Any, Any, Any]) -> Any:
        spec = self.float8_config.input_scale  # type: ignore[union-attr]
        ub = spec.activation_scale_ub if spec.activation_scale_ub is not None else float("inf")
        if spec.is_tensor:
            q, s = ops.quantize_dynamic_float8(x.reshape([1, -1]), -1, ub, DType.float8_e4m3fn, DType.float32)
            q, s = q.reshape([-1, x.shape[1]]), ops.broadcast_to(s, [x.shape[0], 1])
        else:
            group = spec.block_size[1] if spec.is_block else -1  # type: ignore[index]
            q, s = ops.quantize_dynamic_float8(x, group, ub, DType.float8_e4m3fn, DType.float32)
        if which == "gate_up":
            weight, scales = self.gate_up_proj, self.gate_up_proj_scales
        else:
            weight, scales = self.down_proj, self.down_proj_scales
        return ops.grouped_scaled_matmul_ragged(q, weight, s, scales, *groups, x.dtype)
