"""`KVCacheParams` and `KVCacheStrategy`: the shape of a model's KV cache."""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any

from lowering.dtypes import DType
from lowering.types import BufferType, DeviceRef, TensorType
from maxfx.driver._tensor import Buffer
from maxfx.nn.kv_cache._data_parallel import split_into_groups
from maxfx.nn.kv_cache._memory import KVCacheBuffer, KVCacheQuantizationConfig
from maxfx.nn.kv_cache._symbolic_inputs import KVCacheInputsPerDevice, KVCacheLeafInputs

__all__ = ["KVCacheParams", "KVCacheStrategy", "MHAKVCacheParams", "MLAKVCacheParams"]


class KVCacheStrategy(str, enum.Enum):
    """How the KV cache is stored: ``PAGED`` (maxfx's paged block pool) or ``MODEL_DEFAULT``
    (resolved to the model's own strategy, which is ``PAGED`` for every maxfx model)."""

    MODEL_DEFAULT = "model_default"
    PAGED = "paged"

    def kernel_substring(self) -> str:
        """The strategy's part of kernel names (``"paged"``).

        Raises:
            ValueError: for ``MODEL_DEFAULT``, which must be resolved to a concrete strategy first.
        """
        if self is KVCacheStrategy.MODEL_DEFAULT:
            raise ValueError(
                "KVCacheStrategy.MODEL_DEFAULT has no kernels: resolve it to a concrete strategy (PAGED) first"
            )
        return self.value

    def uses_opaque(self) -> bool:
        """True when kernels take the cache as one opaque collection (`PagedCacheValues`)."""
        return self is KVCacheStrategy.PAGED


@dataclass
class KVCacheParams:
    """Configuration of a model's KV cache.

    ``n_kv_heads_per_device`` is computed: all heads on every device with data
    parallelism, else ``n_kv_heads // n_devices`` (1 when devices outnumber heads,
    which then repeat). ``page_size`` (tokens per page) is required for
    ``PAGED``; MAX's kernels need multiples of 128, maxfx's take any positive size.

    Example:
        >>> p = KVCacheParams(DType.bfloat16, n_kv_heads=8, head_dim=64, page_size=128)
        >>> p.dtype_shorthand, p.n_kv_heads_per_device
        ('bf16', 8)
    """

    dtype: DType
    n_kv_heads: int
    head_dim: int
    enable_prefix_caching: bool = False
    enable_kvcache_swapping_to_host: bool = False
    host_kvcache_swap_space_gb: float | None = None
    cache_strategy: KVCacheStrategy = KVCacheStrategy.PAGED
    page_size: int | None = None
    n_devices: int = 1
    is_mla: bool = False
    data_parallel_degree: int = 1
    n_kv_heads_per_device: int = 0
    kvcache_quant_config: KVCacheQuantizationConfig | None = None

    def __hash__(self) -> int:
        # Layers keep their cache params as static (jit-cache key) data: hash what == compares.
        return hash(tuple(_frozen(getattr(self, f.name)) for f in dataclasses.fields(self)))

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            raise TypeError(f"KVCacheParams: dtype must be a DType, got {type(self.dtype).__name__}")
        self.cache_strategy = KVCacheStrategy(self.cache_strategy)
        for name in ("n_kv_heads", "head_dim", "n_devices", "data_parallel_degree"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"KVCacheParams: {name} must be >= 1, got {getattr(self, name)}")
        if self.cache_strategy is KVCacheStrategy.PAGED and (self.page_size is None or int(self.page_size) < 1):
            raise ValueError(
                f"KVCacheParams: page_size (tokens per page) is required for the PAGED strategy, got {self.page_size}"
            )
        if self.enable_kvcache_swapping_to_host and self.host_kvcache_swap_space_gb is None:
            raise ValueError(
                "KVCacheParams: host_kvcache_swap_space_gb is required when enable_kvcache_swapping_to_host is set"
            )
        if self.data_parallel_degree not in (1, self.n_devices):
            raise ValueError(
                f"KVCacheParams: data_parallel_degree must be 1 or n_devices ({self.n_devices}), got "
                f"{self.data_parallel_degree} (DP+TP is not supported)"
            )
        if self.quantized_kv_cache and self.head_dim % self.kvcache_quant_config.quantization_granularity:
            raise ValueError(
                f"KVCacheParams: the quantization granularity ({self.kvcache_quant_config.quantization_granularity}) "
                f"must evenly divide head_dim ({self.head_dim})"
            )
        self.n_kv_heads_per_device = self._heads_per_device()

    def _heads_per_device(self) -> int:
        if self.data_parallel_degree > 1 or self.n_devices == 1:
            return self.n_kv_heads
        if self.n_kv_heads % self.n_devices == 0:
            return self.n_kv_heads // self.n_devices
        if self.n_devices % self.n_kv_heads == 0:
            return 1
        raise ValueError(f"KVCacheParams: {self.n_kv_heads} KV heads cannot be split over {self.n_devices} devices")

    @property
    def dtype_shorthand(self) -> str:
        """``'bf16'`` for bfloat16 caches, else ``'f32'``."""
        return "bf16" if self.dtype is DType.bfloat16 else "f32"

    @property
    def static_cache_shape(self) -> tuple[str, str, str, str, str]:
        """Dimension names of a contiguous (non-paged) cache tensor."""
        return ("num_layers", "batch_size", "seq_len", "n_kv_heads", "head_dim")

    @property
    def kv_dim(self) -> int:
        """Entries per cached token: 2 (K and V), or 1 for MLA's single latent cache."""
        return 1 if self.is_mla else 2

    def copy_as_dp_1(self) -> KVCacheParams:
        """A copy with data parallelism off and ``n_devices`` divided by the old degree.

        Raises:
            ValueError: ``n_devices`` is not divisible by ``data_parallel_degree``.
        """
        if self.n_devices % self.data_parallel_degree:
            raise ValueError(
                f"KVCacheParams.copy_as_dp_1: n_devices ({self.n_devices}) is not divisible by data_parallel_degree "
                f"({self.data_parallel_degree})"
            )
        return dataclasses.replace(
            self, n_devices=self.n_devices // self.data_parallel_degree, data_parallel_degree=1, n_kv_heads_per_device=0
        )

    def _tensor_parallel(self, devices: list[DeviceRef]) -> KVCacheParams:
        """A copy for the tensor-parallel ``devices`` (no data parallelism): what each shard of a layer uses."""
        return dataclasses.replace(self, n_devices=len(devices), data_parallel_degree=1, n_kv_heads_per_device=0)

    # -- memory (MAX's sizing of the page pool) ------------------------------
    @property
    def tensor_parallel_degree(self) -> int:
        """Devices per data-parallel replica."""
        return self.n_devices // self.data_parallel_degree

    @property
    def quantized_kv_cache(self) -> bool:
        """Whether the cache is quantized: FP8/int8 values with a `KVCacheQuantizationConfig` of float32/e8m0/float16
        scales.
        """
        return (
            self.kvcache_quant_config is not None
            and self.dtype in (DType.float8_e4m3fn, DType.float8_e4m3fnuz, DType.int8)
            and self.kvcache_quant_config.scale_dtype in (DType.float32, DType.float8_e8m0fnu, DType.float16)
        )

    @property
    def kv_cache_scale_dtype(self) -> DType:
        """The scales' dtype (float32 when the cache is not quantized)."""
        return self.kvcache_quant_config.scale_dtype if self.quantized_kv_cache else DType.float32

    def _num_layers(self) -> int:
        layers = getattr(self, "num_layers", None)
        if layers is None:
            raise ValueError(
                f"{type(self).__name__}: the page size in bytes needs num_layers; use "
                "MHAKVCacheParams/MLAKVCacheParams (MAX 26.5's constructors)"
            )
        return int(layers)

    @property
    def shape_per_block(self) -> list[int]:
        """One page of one device: ``[kv_dim, num_layers, page_size, n_kv_heads_per_device, head_dim]``."""
        return [self.kv_dim, self._num_layers(), int(self.page_size or 1), self.n_kv_heads_per_device, self.head_dim]

    @property
    def shape_per_scale_block(self) -> list[int]:
        """One page of scales: `shape_per_block` with ``ceil(head_dim / granularity)`` last.

        Raises:
            ValueError: the cache has no quantization config.
        """
        if self.kvcache_quant_config is None:
            raise ValueError(f"{type(self).__name__}.shape_per_scale_block: the cache has no kvcache_quant_config")
        shape = self.shape_per_block
        shape[4] = math.ceil(shape[4] / self.kvcache_quant_config.quantization_granularity)
        return shape

    @property
    def bytes_per_value_block(self) -> int:
        """Bytes of one page's values over a replica's tensor-parallel devices."""
        return math.prod(self.shape_per_block) * self.dtype.size_in_bytes * self.tensor_parallel_degree

    @property
    def bytes_per_scale_block(self) -> int:
        """Bytes of one page's scales over a replica's devices (0 when not quantized)."""
        if not self.quantized_kv_cache:
            return 0
        return (
            math.prod(self.shape_per_scale_block)
            * self.kvcache_quant_config.scale_dtype.size_in_bytes
            * self.tensor_parallel_degree
        )

    @property
    def bytes_per_block(self) -> int:
        """Bytes one page costs over a replica's tensor-parallel devices, scales included."""
        return self.bytes_per_value_block + self.bytes_per_scale_block

    @property
    def replicates_kv_across_tp(self) -> bool:
        """Whether every tensor-parallel shard holds the same values (MLA's latent cache on 2+ devices)."""
        return self.is_mla and self.tensor_parallel_degree > 1

    def allocate_buffers(self, total_num_pages: int) -> list[KVCacheBuffer]:
        """Zero-filled block tensors of ``total_num_pages`` pages: one `KVCacheBuffer` per data-parallel replica.

        Each holds one ``[total_num_pages, *shape_per_block]`` tensor per
        tensor-parallel device (and one of scales per device when quantized).

        Example:
            >>> from maxfx.graph import DeviceRef
            >>> p = MHAKVCacheParams(DType.float32, head_dim=8, num_layers=2, devices=[DeviceRef.CPU()], n_kv_heads=2,
            ...     page_size=16)
            >>> [b.shape for b in p.allocate_buffers(total_num_pages=4)[0].values]
            [(4, 2, 2, 16, 2, 8)]
        """
        out = []
        for devices in split_into_groups(self._symbolic_devices(), self.data_parallel_degree):
            devs = [d.to_device() for d in devices]
            values = [Buffer.zeros([int(total_num_pages), *self.shape_per_block], self.dtype, device=d) for d in devs]
            scales = (
                [
                    Buffer.zeros(
                        [int(total_num_pages), *self.shape_per_scale_block], self.kv_cache_scale_dtype, device=d
                    )
                    for d in devs
                ]
                if self.quantized_kv_cache
                else None
            )
            out.append(
                KVCacheBuffer(replicates_kv_across_tp=self.replicates_kv_across_tp, values=values, scales=scales)
            )
        return out

    def blocks_shape(self, num_layers: Any = "num_layers", total_num_pages: Any = "total_num_pages") -> list[Any]:
        """Shape of the paged block pool: ``[total_num_pages, kv_dim, num_layers, page_size, n_kv_heads_per_device,
        head_dim]``.
        """
        return [
            total_num_pages,
            self.kv_dim,
            num_layers,
            int(self.page_size or 1),
            self.n_kv_heads_per_device,
            self.head_dim,
        ]

    def input_types(self, device: Any = None) -> list[Any]:
        """Graph input types of one step's cache: blocks (a buffer), cache_lengths, lookup_table, max_lengths.

        Pass ``[v for v in graph.inputs[i:i+4]]`` to `PagedCacheValues.from_graph_inputs`.

        Example:
            >>> [str(t.dtype) for t in KVCacheParams(DType.float32, 2, 8, page_size=16).input_types()]
            ['DType.float32', 'DType.uint32', 'DType.uint32', 'DType.uint32']
        """
        if self.cache_strategy is not KVCacheStrategy.PAGED:
            raise ValueError(
                f"KVCacheParams.input_types: only the PAGED strategy has graph inputs, got {self.cache_strategy}"
            )
        dev = DeviceRef.from_device(device) if device is not None else DeviceRef.CPU()
        return [
            BufferType(self.dtype, self.blocks_shape(), dev),
            TensorType(DType.uint32, ["batch_size"], dev),
            TensorType(DType.uint32, ["batch_size", "max_num_pages"], dev),
            TensorType(DType.uint32, ["steps_remaining", 2], DeviceRef.CPU()),
        ]

    # -- MAX's structured graph inputs ---------------------------------------
    def _symbolic_devices(self) -> list[DeviceRef]:
        devices = getattr(self, "devices", None)
        return list(devices) if devices else [DeviceRef.CPU()] * self.n_devices

    def _dispatch_metadata_type(self, device: DeviceRef) -> TensorType:
        """MAX's decode-dispatch scalars: 3 int64 on the device for MLA, 4 on the host otherwise."""
        return TensorType(DType.int64, [3], device) if self.is_mla else TensorType(DType.int64, [4], DeviceRef.CPU())

    def get_symbolic_inputs(self, namespace: str = "") -> Any:
        """The cache's graph input types: one `KVCacheInputsPerDevice` per device, in a `KVCacheLeafInputs`.

        ``namespace`` prefixes the pool's page-count dim (``{namespace}total_num_pages``)
        so that sibling caches of a `MultiKVCacheParams` tree have their own.

        Devices are split into ``data_parallel_degree`` replicas; replica ``r``'s
        dynamic dims are named ``replica_{r}_batch_size``, ``replica_{r}_max_num_pages``
        (the pool's page count is ``total_num_pages``). Per device: the block pool
        (a buffer), ``cache_lengths`` and ``lookup_table`` (uint32, on the device),
        ``max_prompt_length`` / ``max_cache_length`` (uint32 ``[1]`` on the host),
        the decode-dispatch metadata (int64; MLA: ``[3]`` on the device, else ``[4]``
        on the host) and, for MLA, ``mla_num_partitions`` (int64 ``[1]`` on the host).
        maxfx's kernels read only the first five; the rest keeps MAX's input layout.

        Raises:
            ValueError: the strategy is not PAGED, or the devices do not split into the replicas.

        Example:
            >>> from maxfx.graph import DeviceRef
            >>> p = MHAKVCacheParams(DType.float32, head_dim=8, num_layers=1, devices=[DeviceRef.CPU()], n_kv_heads=2,
            ...     page_size=16)
            >>> [type(t).__name__ for t in p.get_symbolic_inputs().flatten()]
            ['BufferType', 'TensorType', 'TensorType', 'TensorType', 'TensorType', 'TensorType']
        """
        name = type(self).__name__
        if self.cache_strategy is not KVCacheStrategy.PAGED:
            raise ValueError(
                f"{name}.get_symbolic_inputs: only the PAGED strategy has graph inputs, got {self.cache_strategy}"
            )
        devices = self._symbolic_devices()
        replicas = self.data_parallel_degree
        if len(devices) % replicas:
            raise ValueError(
                f"{name}.get_symbolic_inputs: {len(devices)} devices do not split into data_parallel_degree={replicas} "
                "replicas"
            )
        per_replica = len(devices) // replicas
        layers = getattr(self, "num_layers", "num_layers")
        host = DeviceRef.CPU()
        out = []
        for i, dev in enumerate(devices):
            prefix = f"replica_{i // per_replica}_"
            out.append(
                KVCacheInputsPerDevice(
                    kv_blocks=BufferType(self.dtype, self.blocks_shape(layers, f"{namespace}total_num_pages"), dev),
                    cache_lengths=TensorType(DType.uint32, [prefix + "batch_size"], dev),
                    lookup_table=TensorType(DType.uint32, [prefix + "batch_size", prefix + "max_num_pages"], dev),
                    max_prompt_length=TensorType(DType.uint32, [1], host),
                    max_cache_length=TensorType(DType.uint32, [1], host),
                    attention_dispatch_metadata=self._dispatch_metadata_type(dev),
                    mla_num_partitions=TensorType(DType.int64, [1], host) if self.is_mla else None,
                )
            )
        return KVCacheLeafInputs(inputs=out)

    def flattened_kv_inputs(self) -> list[Any]:
        """The cache's graph input types in graph-input order (`get_symbolic_inputs` flattened).

        Example:
            >>> from maxfx.graph import DeviceRef
            >>> p = MHAKVCacheParams(DType.float32, head_dim=8, num_layers=1, devices=[DeviceRef.CPU()], n_kv_heads=2,
            ...     page_size=16)
            >>> [type(t).__name__ for t in p.flattened_kv_inputs()][:2]
            ['BufferType', 'TensorType']
        """
        return self.get_symbolic_inputs().flatten()

    def unflatten_kv_inputs(self, it: Any) -> Any:
        """`get_symbolic_inputs` rebuilt from an iterator of graph inputs (values in the same order)."""
        return self.get_symbolic_inputs().unflatten(iter(it))


def _frozen(value: Any) -> Any:
    """``value`` with lists made tuples (and dataclasses, e.g. a `KVCacheQuantizationConfig`, their fields), so that it
    hashes.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple(_frozen(getattr(value, f.name)) for f in dataclasses.fields(value)))
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


class MHAKVCacheParams(KVCacheParams):
    """KV-cache parameters of multi-head (and grouped-query) attention, with MAX 26.5's constructor.

    MAX 26.5 names the cache's layers and devices (``num_layers``,
    ``devices``) and takes the head count by keyword. ``n_devices`` is
    ``len(devices)``; ``page_size`` defaults to 128 as in MAX. With
    ``allow_kv_head_replication`` the KV heads may be fewer than the devices
    (each device then holds one replicated head); otherwise they must split
    evenly.

    Raises:
        ValueError: if ``devices`` is empty, ``num_layers`` < 1, or the heads
            cannot be split over the devices.

    Example:
        >>> from maxfx.graph import DeviceRef
        >>> p = MHAKVCacheParams(DType.float32, head_dim=64, num_layers=2, devices=[DeviceRef.CPU()], n_kv_heads=8)
        >>> p.n_devices, p.num_layers, p.page_size, p.n_kv_heads_per_device
        (1, 2, 128, 8)
    """

    def __init__(
        self,
        dtype: DType,
        head_dim: int,
        num_layers: int,
        devices: Any,
        enable_prefix_caching: bool = False,
        host_kvcache_swap_space_gb: float | None = None,
        page_size: int = 128,
        data_parallel_degree: int = 1,
        *,
        n_kv_heads: int,
        allow_kv_head_replication: bool = False,
        cache_strategy: KVCacheStrategy = KVCacheStrategy.PAGED,
        kvcache_quant_config: KVCacheQuantizationConfig | None = None,
    ) -> None:
        devs = _device_list(devices, type(self).__name__)
        if int(num_layers) < 1:
            raise ValueError(f"{type(self).__name__}: num_layers must be >= 1, got {num_layers}")
        self.num_layers = int(num_layers)
        self.devices = devs
        self.allow_kv_head_replication = bool(allow_kv_head_replication)
        n = len(devs)
        if not allow_kv_head_replication and data_parallel_degree == 1 and n > 1 and int(n_kv_heads) % n:
            raise ValueError(
                f"{type(self).__name__}: {n_kv_heads} KV heads do not split evenly over {n} devices; pass "
                "allow_kv_head_replication=True to replicate them"
            )
        super().__init__(
            dtype=dtype,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            enable_prefix_caching=enable_prefix_caching,
            enable_kvcache_swapping_to_host=host_kvcache_swap_space_gb is not None,
            host_kvcache_swap_space_gb=host_kvcache_swap_space_gb,
            cache_strategy=cache_strategy,
            page_size=page_size,
            n_devices=n,
            is_mla=False,
            data_parallel_degree=data_parallel_degree,
            kvcache_quant_config=kvcache_quant_config,
        )

    def blocks_shape(self, num_layers: Any = None, total_num_pages: Any = "total_num_pages") -> list[Any]:
        """Shape of the paged block pool; ``num_layers`` defaults to this cache's."""
        return super().blocks_shape(self.num_layers if num_layers is None else num_layers, total_num_pages)

    def _tensor_parallel(self, devices: list[DeviceRef]) -> KVCacheParams:
        out = copy.copy(self)
        out.devices = list(devices)
        out.n_devices, out.data_parallel_degree = len(devices), 1
        out.n_kv_heads_per_device = out._heads_per_device()
        return out

    def copy_as_dp_1(self) -> KVCacheParams:
        """A copy with data parallelism off: each replica's devices (``n_devices // data_parallel_degree`` of them)."""
        if self.n_devices % self.data_parallel_degree:
            raise ValueError(
                f"{type(self).__name__}.copy_as_dp_1: n_devices ({self.n_devices}) is not divisible by "
                f"data_parallel_degree ({self.data_parallel_degree})"
            )
        out = copy.copy(self)
        out.devices = self.devices[: self.n_devices // self.data_parallel_degree]
        out.n_devices = len(out.devices)
        out.data_parallel_degree = 1
        out.n_kv_heads_per_device = out._heads_per_device()
        return out


class MLAKVCacheParams(MHAKVCacheParams):
    """KV-cache parameters of multi-latent attention (one latent "head" per token), MAX 26.5's constructor.

    ``head_dim`` is the cached latent width (``kv_lora_rank + qk_rope_head_dim``);
    ``num_q_heads`` the attention's query heads. The cache holds one entry per
    token (``kv_dim == 1``).

    Example:
        >>> from maxfx.graph import DeviceRef
        >>> p = MLAKVCacheParams(DType.float32, head_dim=576, num_layers=1, devices=[DeviceRef.CPU()], num_q_heads=16,
        ...     page_size=64)
        >>> p.is_mla, p.n_kv_heads, p.kv_dim, p.num_q_heads
        (True, 1, 1, 16)
    """

    def __init__(
        self,
        dtype: DType,
        head_dim: int,
        num_layers: int,
        devices: Any,
        enable_prefix_caching: bool = False,
        host_kvcache_swap_space_gb: float | None = None,
        page_size: int = 128,
        data_parallel_degree: int = 1,
        *,
        num_q_heads: int,
        cache_strategy: KVCacheStrategy = KVCacheStrategy.PAGED,
    ) -> None:
        if int(num_q_heads) < 1:
            raise ValueError(f"MLAKVCacheParams: num_q_heads must be >= 1, got {num_q_heads}")
        self.num_q_heads = int(num_q_heads)
        super().__init__(
            dtype,
            head_dim,
            num_layers,
            devices,
            enable_prefix_caching,
            host_kvcache_swap_space_gb,
            page_size,
            data_parallel_degree,
            n_kv_heads=1,
            allow_kv_head_replication=True,
            cache_strategy=cache_strategy,
        )
        self.is_mla = True

    def _heads_per_device(self) -> int:
        return 1  # the latent cache is replicated on every device


def _device_list(devices: Any, where: str) -> list[DeviceRef]:
    try:
        devs = [d if isinstance(d, DeviceRef) else DeviceRef.from_device(d) for d in devices]
    except TypeError:
        raise TypeError(f"{where}: devices must be a sequence of DeviceRef, got {type(devices).__name__}") from None
    if not devs:
        raise ValueError(f"{where}: devices must name at least one device")
    return devs
