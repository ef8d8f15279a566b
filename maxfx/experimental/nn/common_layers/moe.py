"""``max.experimental.nn.common_layers.moe``: eager Mixture of Experts (`MoE`, `TensorParallelMoE`).

Each token goes to its ``num_experts_per_token`` best experts (`MoEGate`: the
top-k of the router logits); each expert is a gated MLP and the expert
outputs are summed weighted by the router scores. The experts run as two
grouped matmuls over the tokens sorted by expert, with the same kernels as
the graph-API ``maxfx.nn.MoE`` (``moe_create_indices``,
``grouped_matmul_ragged``).

`TensorParallelMoE` splits every expert's ``moe_dim`` over a one-axis
`DeviceMesh`: device ``i`` holds rows ``i`` of each gate/up projection and
the matching columns of each down projection, so each device's output is a
partial sum (`Partial` placement) that an all-reduce completes.

Example:
    >>> from maxfx.experimental.tensor import Tensor
    >>> moe = MoE(hidden_dim=8, num_experts=4, num_experts_per_token=2, moe_dim=16)
    >>> [list(map(int, w.shape)) for w in moe.gate_up_proj], moe(Tensor.ones([3, 8])).shape
    ([[4, 32, 8]], [Dim(3), Dim(8)])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from maxfx.driver import CPU, Device
from maxfx.experimental import functional as F
from maxfx.experimental.nn._layers import Linear, ModuleList
from maxfx.experimental.nn.common_layers.mlp import MLP
from maxfx.experimental.nn.module import Module
from maxfx.experimental.sharding import (
    DeviceMapping,
    DeviceMesh,
    DistributedTensor,
    Partial,
    PlacementMapping,
    distribute,
    from_shards,
    shard_sizes,
)
from maxfx.experimental.tensor import Tensor
from maxfx.nn._moe_math import routed_experts as _routed_experts
from maxfx.nn.kernels import grouped_matmul_ragged

__all__ = ["MoE", "MoEGate", "TensorParallelMoE", "routed_experts", "shard_and_stack"]


class MoEGate(Module):
    """Router: the top ``num_experts_per_token`` of ``gate_score(x)`` per token.

    Returns ``(topk_indices [tokens, k], topk_scores [tokens, k])``.
    """

    def __init__(self, hidden_dim: int, num_experts: int, num_experts_per_token: int):
        if not 0 < int(num_experts_per_token) <= int(num_experts):
            raise ValueError(
                f"MoEGate: num_experts_per_token must be in [1, num_experts={num_experts}], got {num_experts_per_token}"
            )
        self.hidden_dim, self.num_experts, self.num_experts_per_token = (
            int(hidden_dim),
            int(num_experts),
            int(num_experts_per_token),
        )
        self.gate_score = Linear(hidden_dim, num_experts, bias=False)

    def forward(self, hidden_state: Tensor) -> tuple[Tensor, Tensor]:
        scores, indices = F.top_k(self.gate_score(hidden_state), k=self.num_experts_per_token, axis=-1)
        return indices, scores


def routed_experts(
    x: Tensor,
    topk_indices: Tensor,
    topk_weights: Tensor,
    gate_up: Tensor,
    down: Tensor,
    *,
    moe_dim: int,
    apply_router_weight_first: bool = False,
) -> Tensor:
    """The routed experts' output for ``x [tokens, hidden]`` on one device.

    ``gate_up [E, 2 * moe_dim, hidden]`` holds each expert's gate rows then up
    rows, ``down [E, hidden, moe_dim]``; ``topk_indices``/``topk_weights``
    ``[tokens, k]`` come from the router. Tokens are sorted by expert
    (``moe_create_indices``), each expert's rows go through two grouped matmuls
    with ``silu(gate) * up`` between them, and the results are put back in token
    order and summed weighted by the router (before the experts with
    ``apply_router_weight_first``): `maxfx.nn._moe_math.routed_experts`, the
    graph-API MoE's math, summing in the experts' dtype.
    """

    def matmul(rows: Tensor, which: str, groups: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        return grouped_matmul_ragged(rows, gate_up if which == "gate_up" else down, *groups)

    num_experts = int(gate_up.shape[0])
    return _routed_experts(
        x,
        topk_indices,
        topk_weights,
        num_experts,
        matmul,
        moe_dim=moe_dim,
        host=CPU(),
        apply_router_weight_first=apply_router_weight_first,
    )


def shard_and_stack(weights: list[Tensor], devices: tuple[Any, ...], axis: int = 0) -> list[Tensor]:
    """Split each of ``weights`` along ``axis`` into ``len(devices)`` balanced pieces; device ``i`` gets its pieces
    stacked.

    Example:
        >>> [list(map(int, s.shape)) for s in shard_and_stack([Tensor.ones([4, 2])] * 3, (CPU(), CPU()))]
        [[3, 2, 2], [3, 2, 2]]
    """
    n = len(devices)
    out = []
    for i, dev in enumerate(devices):
        pieces = []
        for w in weights:
            ax = axis % w.rank
            sizes = shard_sizes(int(w.shape[ax]), n)
            start = sum(sizes[:i])
            index = tuple(slice(start, start + sizes[i]) if d == ax else slice(None) for d in range(w.rank))
            pieces.append(w[index])
        out.append(F.stack(pieces, axis=0).to(dev))
    return out


def _mesh(target: Any) -> DeviceMesh:
    if isinstance(target, DeviceMesh):
        return target
    if isinstance(target, DeviceMapping):
        return target.mesh
    if isinstance(target, Device):
        return DeviceMesh.single(target)
    raise TypeError(f"expected a Device, DeviceMesh or DeviceMapping, got {type(target).__name__}")


class MoE(Module):
    """Mixture of Experts over ``x [tokens, hidden_dim]`` on one device.

    Args:
        hidden_dim: token width.
        num_experts: number of experts (gated MLPs ``moe_dim`` wide).
        num_experts_per_token: experts each token goes to.
        moe_dim: each expert's inner width.
        gate_cls: the router class (`MoEGate` by default).
        has_shared_experts: add a ``shared_experts`` MLP (``shared_experts_dim`` wide) for every token.
        shared_experts_dim: width of the shared experts.
        apply_router_weight_first: scale the expert inputs by the router score instead of the outputs.
    """

    def __init__(
        self,
        hidden_dim: int,
        num_experts: int,
        num_experts_per_token: int,
        moe_dim: int,
        gate_cls: Callable[..., MoEGate] = MoEGate,
        has_shared_experts: bool = False,
        shared_experts_dim: int = 0,
        apply_router_weight_first: bool = False,
    ):
        if has_shared_experts and int(shared_experts_dim) <= 0:
            raise ValueError(
                f"{type(self).__name__}: has_shared_experts needs shared_experts_dim > 0, got {shared_experts_dim}"
            )
        self.hidden_dim, self.num_experts, self.num_experts_per_token = (
            int(hidden_dim),
            int(num_experts),
            int(num_experts_per_token),
        )
        self.moe_dim, self.apply_router_weight_first = int(moe_dim), bool(apply_router_weight_first)
        self.gate = gate_cls(
            hidden_dim=hidden_dim, num_experts=num_experts, num_experts_per_token=num_experts_per_token
        )
        self.shared_experts = MLP(self.hidden_dim, int(shared_experts_dim), bias=False) if has_shared_experts else None
        self.experts = ModuleList([MLP(self.hidden_dim, self.moe_dim, bias=False) for _ in range(self.num_experts)])

    def to(self, target: Any) -> MoE:
        """Move to one device (a Device, or a one-device mesh or mapping).

        Raises:
            ValueError: a mesh of several devices (use `TensorParallelMoE`).
        """
        mesh = _mesh(target)
        if mesh.num_devices > 1:
            raise ValueError(
                f"Cannot move an MoE layer to a multi-device mesh ({mesh}); use TensorParallelMoE instead."
            )
        return super().to(mesh.devices[0])

    @property
    def gate_up_proj(self) -> list[Tensor]:
        """Per-device bundle (one entry here): every expert's gate then up rows, ``[num_experts, 2 * moe_dim,
        hidden_dim]``.
        """
        rows = [w for e in self.experts for w in (e.gate_proj.weight, e.up_proj.weight)]
        return [F.stack(rows, axis=0).reshape([self.num_experts, -1, self.hidden_dim])]

    @property
    def down_proj(self) -> list[Tensor]:
        """Per-device bundle (one entry here): every expert's down projection, ``[num_experts, hidden_dim,
        moe_dim]``.
        """
        return [F.stack([e.down_proj.weight for e in self.experts], axis=0)]

    def forward(self, x: Tensor) -> Tensor:
        if x.rank != 2 or int(x.shape[1]) != self.hidden_dim:
            raise ValueError(
                f"{type(self).__name__}: x must be [tokens, {self.hidden_dim}], got {x.dtype.name}{list(x.shape)}"
            )
        indices, weights = self.gate(x)
        out = routed_experts(
            x,
            indices,
            weights,
            self.gate_up_proj[0],
            self.down_proj[0],
            moe_dim=self.moe_dim,
            apply_router_weight_first=self.apply_router_weight_first,
        )
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class TensorParallelMoE(MoE):
    """`MoE` with every expert's ``moe_dim`` split over a one-axis mesh (`to` a `DeviceMesh`).

    The router is replicated; device ``i`` computes the experts (and shared
    experts) on its slice of ``moe_dim``, so the output is ``Partial()``: the
    sum over devices is the MoE's output. Inputs must be replicated over the mesh.

    Example:
        >>> from maxfx.experimental.sharding import DeviceMesh
        >>> moe = TensorParallelMoE(hidden_dim=8, num_experts=4, num_experts_per_token=2, moe_dim=16)
        >>> [list(map(int, w.shape)) for w in moe.to(DeviceMesh((CPU(), CPU()), (2,), ("tp",))).gate_up_proj]
        [[4, 16, 8], [4, 16, 8]]
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._initial_moe_dim = self.moe_dim
        self.mesh = DeviceMesh.single(self.device)

    def to(self, target: Any) -> TensorParallelMoE:
        """Lay the layer out over ``target`` (a Device, a one-axis DeviceMesh or a mapping on one).

        Raises:
            ValueError: a mesh with several axes, or a ``moe_dim`` (or shared
                experts' width) that does not split evenly over its devices.
        """
        mesh = _mesh(target)
        if mesh.ndim != 1:
            raise ValueError(f"Mesh used with TensorParallelMoE must have exactly one device axis, but got {mesh}")
        n = mesh.num_devices
        shared = self.shared_experts.feed_forward_length if self.shared_experts is not None else 0
        if self._initial_moe_dim % n or shared % n:
            raise ValueError(
                f"TensorParallelMoE: moe_dim ({self._initial_moe_dim}) and shared_experts_dim ({shared}) must split "
                f"evenly over {n} devices"
            )
        self.mesh, self.moe_dim = mesh, self._initial_moe_dim // n
        if n == 1:
            Module.to(self, mesh.devices[0])
            return self
        # The router is replicated; experts stay where they are and each device gets its slices (gate_up_proj,
        # down_proj).
        self.gate.apply_to_parameters(lambda _, t: distribute(t, mesh))
        return self

    @property
    def gate_up_proj(self) -> list[Tensor]:
        """Per-device bundle: device ``i`` holds rows ``i`` of every expert's gate and up projections, ``[E, 2 * moe_dim
        / n, hidden]``.
        """
        if self.mesh.num_devices == 1:
            return super().gate_up_proj
        rows = [w for e in self.experts for w in (e.gate_proj.weight, e.up_proj.weight)]
        return [
            s.reshape([self.num_experts, -1, self.hidden_dim]) for s in shard_and_stack(rows, self.mesh.devices, axis=0)
        ]

    @property
    def down_proj(self) -> list[Tensor]:
        """Per-device bundle: device ``i`` holds columns ``i`` of every expert's down projection, ``[E, hidden, moe_dim
        / n]``.
        """
        if self.mesh.num_devices == 1:
            return super().down_proj
        return shard_and_stack([e.down_proj.weight for e in self.experts], self.mesh.devices, axis=-1)

    def _shared_slice(self, x: Tensor, i: int) -> Tensor:
        """Device ``i``'s partial shared-experts output: its slice of the inner width."""
        mlp, n, dev = self.shared_experts, self.mesh.num_devices, self.mesh.devices[i]
        width = mlp.feed_forward_length // n
        rows = slice(i * width, (i + 1) * width)
        gate, up = mlp.gate_proj.weight[rows].to(dev), mlp.up_proj.weight[rows].to(dev)
        down = mlp.down_proj.weight[:, rows].to(dev)
        return (mlp.activation_function(x @ gate.T) * (x @ up.T)) @ down.T

    def forward(self, x: Tensor) -> Tensor:
        if self.mesh.num_devices == 1:
            return super().forward(x)
        if not isinstance(x, DistributedTensor) or x.mesh != self.mesh or not x.mapping.is_fully_replicated:
            raise ValueError(
                f"TensorParallelMoE: x must be replicated over {self.mesh} (Tensor(..., device=PlacementMapping(mesh, "
                f"(Replicated(),)))), got {getattr(x, 'mapping', x)}"
            )
        indices, weights = self.gate(x)  # replicated router, run on every device
        gate_up, down = self.gate_up_proj, self.down_proj
        outs = []
        for i in range(self.mesh.num_devices):
            xi = x.local_shards[i]
            out = routed_experts(
                xi,
                indices.local_shards[i],
                weights.local_shards[i],
                gate_up[i],
                down[i],
                moe_dim=self.moe_dim,
                apply_router_weight_first=self.apply_router_weight_first,
            )
            if self.shared_experts is not None:
                out = out + self._shared_slice(xi, i)
            outs.append(out)
        return from_shards(outs, PlacementMapping(self.mesh, (Partial(),)))
