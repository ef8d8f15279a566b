"""Virtual devices: compile for GPUs (and a CPU) this machine does not have (MAX's compile-only mode).

Process-wide settings, as in MAX's driver:

* ``set_virtual_device_api("cuda")`` and ``set_virtual_device_target_arch("sm_80")``
  name the GPU to compile for; ``set_virtual_device_count(n)`` (n > 0) then turns
  virtual-device mode on: ``accelerator_count()`` is ``n`` and ``Accelerator(i)``
  is a virtual device of that API and architecture, even on a machine without a
  GPU. A virtual device can be compiled for (programs are lowered with
  ``jax.export`` for its platform) but holds no memory and runs nothing.
  ``set_virtual_device_count(0)`` turns the mode off.
* ``set_virtual_cpu_target("x86-64-v3")`` names the CPU that host code is
  compiled for instead of this machine's CPU (``""``: this machine's); set
  before JAX creates its CPU backend, it becomes XLA's ``--xla_cpu_max_isa``.

They live in the engine, beside `lowering.driver_devices` (whose ``Accelerator``
consults them); ``maxfx.driver`` re-exports them.

Example:
    >>> set_virtual_device_api("cuda"); set_virtual_device_target_arch("sm_80")
    >>> set_virtual_device_count(2)
    >>> is_virtual_device_mode(), get_virtual_device_count(), get_virtual_device_api()
    (True, 2, 'cuda')
    >>> set_virtual_device_count(0); is_virtual_device_mode()
    False
"""

from __future__ import annotations

import os
import platform as _platform
import re
import threading
import warnings

__all__ = [
    "get_virtual_cpu_target",
    "get_virtual_device_api",
    "get_virtual_device_count",
    "get_virtual_device_target_arch",
    "is_virtual_device_mode",
    "jax_platform_of_api",
    "set_virtual_cpu_target",
    "set_virtual_device_api",
    "set_virtual_device_count",
    "set_virtual_device_target_arch",
    "xla_cpu_isa",
]

# MAX's GPU API names → the JAX platform a program for them is lowered for.
_API_PLATFORMS = {"cuda": "cuda", "hip": "rocm", "metal": "METAL"}

_lock = threading.Lock()
_state = {"api": "", "arch": "", "count": 0, "cpu": "", "cpu_in_effect": ""}


def _require_str(where: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
    return value


def _refuse_unset_while_on(where: str, value: str) -> None:
    if not value and _state["count"] > 0:
        raise ValueError(
            f"{where}(''): virtual-device mode is on ({_state['count']} device(s)); call set_virtual_device_count(0) "
            "before unsetting its target"
        )


def set_virtual_device_api(api: str) -> None:
    """The GPU API virtual devices compile for: ``"cuda"`` (NVIDIA), ``"hip"`` (AMD) or ``"metal"`` (Apple).

    Call it before `set_virtual_device_count`; ``""`` unsets it.

    Raises:
        TypeError: ``api`` is not a string.
        ValueError: an API other than those three, or ``""`` while the mode is on.

    Example:
        >>> set_virtual_device_api("hip"); get_virtual_device_api()
        'hip'
        >>> set_virtual_device_api("cuda")
    """
    api = _require_str("set_virtual_device_api", api)
    if api and api not in _API_PLATFORMS:
        raise ValueError(f"set_virtual_device_api: unknown GPU API {api!r}; expected one of {sorted(_API_PLATFORMS)}")
    with _lock:
        _refuse_unset_while_on("set_virtual_device_api", api)
        _state["api"] = api


def get_virtual_device_api() -> str:
    """The GPU API set by `set_virtual_device_api` (``""`` if none)."""
    return _state["api"]


def set_virtual_device_target_arch(arch: str) -> None:
    """The GPU architecture virtual devices compile for (``"sm_80"``, ``"sm_90"``, ``"gfx942"``...).

    Call it before `set_virtual_device_count`; ``""`` unsets it.

    Raises:
        TypeError: ``arch`` is not a string.
        ValueError: ``""`` while virtual-device mode is on.

    Example:
        >>> set_virtual_device_target_arch("sm_90"); get_virtual_device_target_arch()
        'sm_90'
    """
    arch = _require_str("set_virtual_device_target_arch", arch).strip()
    with _lock:
        _refuse_unset_while_on("set_virtual_device_target_arch", arch)
        _state["arch"] = arch


def get_virtual_device_target_arch() -> str:
    """The GPU architecture set by `set_virtual_device_target_arch` (``""`` if none)."""
    return _state["arch"]


def set_virtual_device_count(count: int) -> None:
    """Turn virtual-device mode on with ``count`` virtual GPUs, or off with 0.

    While it is on, ``accelerator_count()`` returns ``count`` and
    ``Accelerator(id)`` (``0 <= id < count``) is a virtual device of the API and
    architecture set before, whatever GPUs the machine has.

    Raises:
        TypeError: ``count`` is not an int.
        ValueError: a negative count, or a positive one before
            `set_virtual_device_api` and `set_virtual_device_target_arch`.

    Example:
        >>> set_virtual_device_api("cuda"); set_virtual_device_target_arch("sm_80")
        >>> set_virtual_device_count(1); get_virtual_device_count()
        1
        >>> set_virtual_device_count(0)
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"set_virtual_device_count: expected an int, got {type(count).__name__} {count!r}")
    if count < 0:
        raise ValueError(
            f"set_virtual_device_count: the count must be >= 0 (0 turns virtual-device mode off), got {count}"
        )
    with _lock:
        if count > 0 and not (_state["api"] and _state["arch"]):
            missing = [
                f
                for f, k in (("set_virtual_device_api", "api"), ("set_virtual_device_target_arch", "arch"))
                if not _state[k]
            ]
            raise ValueError(
                f"set_virtual_device_count({count}): call {' and '.join(missing)} first, so the virtual devices have a "
                "target to compile for"
            )
        _state["count"] = count


def get_virtual_device_count() -> int:
    """The number of virtual devices (0 when virtual-device mode is off)."""
    return _state["count"]


def is_virtual_device_mode() -> bool:
    """True while virtual-device mode is on (a count above 0)."""
    return _state["count"] > 0


def jax_platform_of_api(api: str) -> str:
    """The JAX platform that programs for the GPU API ``api`` are lowered for (``"hip"`` → ``"rocm"``)."""
    return _API_PLATFORMS[api]


# ─── the CPU target ───────────────────────────────────────────────────────────
# XLA:CPU cannot take an LLVM CPU name; it can cap the instruction set it emits
# (``xla_cpu_max_isa``). Each accepted name maps to the cap that name implies.
_X86_ISA = {
    "x86-64": "SSE4_2",
    "x86-64-v2": "SSE4_2",
    "nehalem": "SSE4_2",
    "westmere": "SSE4_2",
    "sandybridge": "AVX",
    "ivybridge": "AVX",
    "x86-64-v3": "AVX2",
    "haswell": "AVX2",
    "broadwell": "AVX2",
    "skylake": "AVX2",
    "znver1": "AVX2",
    "znver2": "AVX2",
    "znver3": "AVX2",
    "x86-64-v4": "AVX512",
    "skylake-avx512": "AVX512",
    "cascadelake": "AVX512_VNNI",
    "icelake-server": "AVX512_VNNI",
    "znver4": "AVX512_BF16",
    "sapphirerapids": "AMX_FP16",
}
_ARM_ISA = {
    "generic": "NEON",
    "armv8-a": "NEON",
    "cortex-a72": "NEON",
    "neoverse-n1": "NEON",
    "apple-m1": "NEON",
    "neoverse-v1": "SVE",
    "a64fx": "SVE",
    "neoverse-n2": "SVE2",
    "neoverse-v2": "SVE2",
}


def _host_family() -> str:
    machine = _platform.machine().lower()
    if re.fullmatch(r"x86_64|amd64|i[3-6]86", machine):
        return "x86"
    if machine in ("aarch64", "arm64"):
        return "arm"
    return machine


def xla_cpu_isa(target: str) -> str | None:
    """The ``xla_cpu_max_isa`` cap for the CPU target ``target`` (None for ``""``: this machine's CPU).

    Raises:
        ValueError: a name of another architecture family than this machine's
            (XLA:CPU compiles for the host's family only), or one it cannot map.

    Example:
        >>> xla_cpu_isa("") is None
        True
    """
    if not target:
        return None
    family = _host_family()
    table = {"x86": _X86_ISA, "arm": _ARM_ISA}.get(family)
    if table is None:
        raise ValueError(
            f"set_virtual_cpu_target: this machine's CPU family ({_platform.machine()}) has no virtual CPU targets; "
            "only x86-64 and AArch64 hosts do"
        )
    name = "x86-64" if (family == "x86" and target == "generic") else target
    if name not in table:
        other = _ARM_ISA if family == "x86" else _X86_ISA
        why = (
            f"it is a CPU of another architecture family than this {family} machine"
            if name in other
            else "maxfx does not know its instruction set"
        )
        raise ValueError(
            f"set_virtual_cpu_target: cannot compile for {target!r}: {why}; known {family} targets are "
            f"{sorted(set(table) | {'generic'})}"
        )
    return table[name]


def set_virtual_cpu_target(cpu: str) -> None:
    """Compile host (CPU) code for the CPU ``cpu`` instead of this machine's CPU.

    ``cpu`` is an LLVM CPU name (``"x86-64-v3"``, ``"skylake-avx512"``,
    ``"neoverse-n1"``), ``"generic"`` for the most portable CPU of this
    machine's family, or ``""`` for this machine's CPU again. XLA:CPU then
    emits no instruction beyond what that CPU has (``xla_cpu_max_isa``), so
    the code runs there. As in MAX, set it before the first CPU compilation:
    XLA:CPU fixes its target when JAX creates its backend, so a later call is
    recorded (`get_virtual_cpu_target` returns it) with a RuntimeWarning that
    this process keeps its target.

    Raises:
        TypeError: ``cpu`` is not a string.
        ValueError: ``"native"`` (that is this machine's CPU: pass ``""``), a
            CPU of another architecture family, or an unknown name.

    Example:
        >>> set_virtual_cpu_target("generic"); get_virtual_cpu_target()
        'generic'
        >>> set_virtual_cpu_target("")
    """
    cpu = _require_str("set_virtual_cpu_target", cpu).strip()
    if cpu == "native":
        raise ValueError(
            "set_virtual_cpu_target: 'native' names this machine's CPU, which is not portable; pass '' for host-CPU "
            "code, or a CPU name such as 'x86-64-v3'"
        )
    isa = xla_cpu_isa(cpu)  # refuses names XLA cannot compile for before anything is stored
    with _lock:
        _state["cpu"] = cpu
        if not _cpu_backend_started():
            _set_xla_flag("xla_cpu_max_isa", isa)
            _state["cpu_in_effect"] = cpu
        elif cpu != _state["cpu_in_effect"]:
            # XLA:CPU fixes its target when JAX creates the backend; MAX, likewise, only honours a target set before CPU
            # kernels compile.
            warnings.warn(
                f"set_virtual_cpu_target({cpu!r}): JAX's CPU backend already exists, compiling for "
                f"{_state['cpu_in_effect'] or 'this machine'!r}; programs compiled in this process keep that target. "
                "Set the target before the first computation (or start Python with MODULAR_TEST_VIRTUAL_CPU_TARGET / "
                "XLA_FLAGS=--xla_cpu_max_isa=...)",
                RuntimeWarning,
                stacklevel=2,
            )


def get_virtual_cpu_target() -> str:
    """The CPU target set by `set_virtual_cpu_target` (``""``: this machine's CPU)."""
    return _state["cpu"]


def _cpu_backend_started() -> bool:
    """Whether JAX has created its backends (XLA:CPU reads its flags then, once)."""
    try:
        from jax._src import xla_bridge  # noqa: PLC0415 - JAX exposes no public query for this

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True  # cannot tell: assume the flags were read already


def _set_xla_flag(name: str, value: str | None) -> None:
    """Set (or, for None, remove) ``--name=value`` in ``XLA_FLAGS``, which the backend reads when JAX creates it."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(f"--{name}=")]
    if value is not None:
        flags.append(f"--{name}={value}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
