"""``max.pipelines.lib.hf_utils``: Hugging Face repos, read offline.

A repo is a local folder, or a repo id found in the user's Hugging Face cache
(``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``,
read when called). maxfx never reaches the network: a repo id that is neither
raises `RepoNotAvailableOfflineError` (a ``ValueError``, as MAX's access errors
are) and a weight file that is not there raises `WeightFilesNotAvailableError`.
Fill the cache elsewhere (``huggingface-cli download <repo>``) and copy it, or
pass a folder.

`SupportedEncoding` and `RepoType` live here, the leaf module that inspects
weights; ``maxfx.pipelines.lib.config`` re-exports them.

Example:
    >>> repo = HuggingFaceRepo("tests/data/models/tiny_llama")
    >>> repo.repo_type, sorted(e.value for e in repo.supported_encodings)
    (<RepoType.local: 'local'>, ['float32', 'q4_0', 'q8_0'])
    >>> {fmt.value: [str(p) for p in files] for fmt, files in repo.files_for_encoding(SupportedEncoding.q8_0).items()}
    {'gguf': ['tiny_llama-q8_0.gguf']}
"""

from __future__ import annotations

import enum
import importlib
import json
import logging
import os
import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import huggingface_hub

from lowering.quantization import QuantizationEncoding
from maxfx._gguf_header import open_reader
from maxfx._json_file import read_json_file

__all__ = [
    "HuggingFaceRepo",
    "RepoNotAvailableOfflineError",
    "RepoType",
    "SupportedEncoding",
    "WeightFilesNotAvailableError",
    "download_weight_files",
    "generate_local_model_path",
    "hf_cache_dir",
    "read_gguf_metadata",
    "try_to_load_from_cache",
    "validate_hf_repo_access",
]

logger = logging.getLogger("max.pipelines")

DEFAULT_REVISION = "main"


def _weights_format() -> Any:
    # maxfx.graph.weights loads JAX: the weight-format enum is fetched on first use only.
    return importlib.import_module("maxfx.graph.weights").WeightsFormat


def _dtype() -> Any:
    return importlib.import_module("lowering.dtypes").DType


class RepoNotAvailableOfflineError(ValueError):
    """A repo id that is neither a local folder nor in the Hugging Face cache (maxfx never downloads)."""


class WeightFilesNotAvailableError(FileNotFoundError):
    """Weight files that are neither local nor in the Hugging Face cache (maxfx never downloads)."""


class RepoType(str, enum.Enum):
    """Where a repo lives: a local folder, or a hub id (read from the Hugging Face cache)."""

    online = "online"
    local = "local"


class SupportedEncoding(str, enum.Enum):
    """Weight encodings a model may come in.

    ``q8_0`` is a maxfx addition (maxfx loads GGUF Q8_0). Every encoding runs on
    the CPU and on GPUs under XLA, so `supported_devices` is both for each.

    Example:
        >>> SupportedEncoding.parse_from_file_name("llama-3-Q4_K_M.gguf"), SupportedEncoding("q8_0").dtype
        (<SupportedEncoding.q4_k: 'q4_k'>, <DType.uint8: 134>)
    """

    float32 = "float32"
    bfloat16 = "bfloat16"
    q4_k = "q4_k"
    q4_0 = "q4_0"
    q6_k = "q6_k"
    q8_0 = "q8_0"
    float8_e4m3fn = "float8_e4m3fn"
    float4_e2m1fnx2 = "float4_e2m1fnx2"
    gptq = "gptq"

    @classmethod
    def parse_from_file_name(cls, name: str) -> SupportedEncoding | None:
        """The encoding a file name states (``f32``, ``bf16``, ``q4_k_m``, ``q8_0``, ``fp8``...), or None."""
        name = name.lower()
        for needles, encoding in _NAME_HINTS:
            if any(n in name for n in needles):
                return encoding
        return None

    @classmethod
    def from_gguf_file_type(cls, file_type: int) -> SupportedEncoding | None:
        """The encoding of a GGUF ``general.file_type`` (llama.cpp's ``LLAMA_FTYPE_*``), or None."""
        return _GGUF_FILE_TYPES.get(int(file_type))

    @property
    def dtype(self) -> Any:
        """The `DType` of the stored weights (``uint8`` for packed encodings)."""
        return getattr(_dtype(), _ENCODING_DTYPES[self][0])

    @property
    def cache_dtype(self) -> Any:
        """The `DType` of the KV cache for this encoding."""
        return getattr(_dtype(), _ENCODING_DTYPES[self][1])

    @property
    def quantization_encoding(self) -> QuantizationEncoding | None:
        """The graph `QuantizationEncoding` (None for float encodings and for q8_0, which maxfx reads as int8
        blocks).
        """
        return _QUANTIZATION_ENCODINGS.get(self)

    @property
    def supported_devices(self) -> tuple[str, ...]:
        """Device types that run this encoding: ``("cpu", "gpu")`` for all of them under XLA."""
        return ("cpu", "gpu")

    def supported_on(self, device_spec: Any) -> bool:
        """Whether a `DeviceSpec` can run this encoding."""
        return device_spec.device_type in self.supported_devices


_NAME_HINTS: tuple[tuple[tuple[str, ...], SupportedEncoding], ...] = (
    (("f32", "fp32", "float32"), SupportedEncoding.float32),
    (("bf16", "bfloat16"), SupportedEncoding.bfloat16),
    (("q4_k",), SupportedEncoding.q4_k),
    (("q4_0",), SupportedEncoding.q4_0),
    (("q6_k",), SupportedEncoding.q6_k),
    (("q8_0",), SupportedEncoding.q8_0),
    (("gptq",), SupportedEncoding.gptq),
    (("fp4", "nvfp4", "float4"), SupportedEncoding.float4_e2m1fnx2),
    (("f8", "fp8", "float8"), SupportedEncoding.float8_e4m3fn),
)

# llama.cpp's LLAMA_FTYPE values (gguf.LlamaFileType) that maxfx has an encoding for.
_GGUF_FILE_TYPES = {
    0: SupportedEncoding.float32,
    2: SupportedEncoding.q4_0,
    7: SupportedEncoding.q8_0,
    14: SupportedEncoding.q4_k,
    15: SupportedEncoding.q4_k,
    18: SupportedEncoding.q6_k,
    32: SupportedEncoding.bfloat16,
}

# encoding -> (weight dtype, KV-cache dtype), as DType member names.
_ENCODING_DTYPES = {
    SupportedEncoding.float32: ("float32", "float32"),
    SupportedEncoding.bfloat16: ("bfloat16", "bfloat16"),
    SupportedEncoding.float8_e4m3fn: ("float8_e4m3fn", "bfloat16"),
    SupportedEncoding.float4_e2m1fnx2: ("uint8", "bfloat16"),
    SupportedEncoding.q4_k: ("uint8", "float32"),
    SupportedEncoding.q4_0: ("uint8", "float32"),
    SupportedEncoding.q6_k: ("uint8", "float32"),
    SupportedEncoding.q8_0: ("uint8", "float32"),
    SupportedEncoding.gptq: ("uint8", "bfloat16"),
}

_QUANTIZATION_ENCODINGS = {
    SupportedEncoding.q4_k: QuantizationEncoding.Q4_K,
    SupportedEncoding.q4_0: QuantizationEncoding.Q4_0,
    SupportedEncoding.q6_k: QuantizationEncoding.Q6_K,
    SupportedEncoding.gptq: QuantizationEncoding.GPTQ,
}

# safetensors header dtype -> encoding.
_SAFETENSORS_DTYPES = {
    "F32": SupportedEncoding.float32,
    "BF16": SupportedEncoding.bfloat16,
    "F8_E4M3": SupportedEncoding.float8_e4m3fn,
}
# Integer/bool tensors (position ids, masks, packed GPTQ words) say nothing about the encoding.
_NEUTRAL_DTYPES = {"I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL"}


# ─── the cache ────────────────────────────────────────────────────────────────


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (read
    now).

    Example:
        >>> hf_cache_dir().name
        'hub'
    """
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def _repo_cache_folder(repo_id: str) -> Path:
    return hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def _snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of ``repo_id`` at ``revision`` (a branch, tag or commit), or None."""
    folder = _repo_cache_folder(repo_id)
    revision = revision or DEFAULT_REVISION
    ref = folder / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = folder / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _offline_message(repo_id: str, revision: str | None) -> str:
    return (
        f"{repo_id!r} (revision {revision or DEFAULT_REVISION!r}) is not available offline: it is not a local folder "
        "and not in the "
        f"Hugging Face cache at {hf_cache_dir()} (set HF_HUB_CACHE or HF_HOME to use another). maxfx never downloads: "
        f"fetch it where there is network (huggingface-cli download {repo_id}) and copy the cache, or pass a local "
        "folder"
    )


def generate_local_model_path(repo_id: str, revision: str) -> str:
    """The cache snapshot folder of ``repo_id`` at ``revision`` (a commit hash, or a branch the cache has a ref for).

    Raises:
        FileNotFoundError: the snapshot is not in the cache.

    Example:
        >>> generate_local_model_path("no-org/no-model", "main")
        Traceback (most recent call last):
        FileNotFoundError: Model path does not exist: ...
    """
    snapshot = _snapshot(repo_id, revision)
    if snapshot is None:
        raise FileNotFoundError(
            f"Model path does not exist: {_repo_cache_folder(repo_id) / 'snapshots' / revision} "
            f"({_offline_message(repo_id, revision)})"
        )
    return str(snapshot)


def validate_hf_repo_access(repo_id: str, revision: str | None = DEFAULT_REVISION) -> None:
    """Check that ``repo_id`` can be read offline: a local folder, or a snapshot in the Hugging Face cache.

    Raises:
        RepoNotAvailableOfflineError: neither (the message says where it looked and what to do).

    Example:
        >>> validate_hf_repo_access("tests/data/models/tiny_llama", "main")
    """
    if not repo_id:
        raise RepoNotAvailableOfflineError(
            "validate_hf_repo_access: repo_id is empty; pass a local folder or a repo id in the Hugging Face cache"
        )
    if Path(repo_id).expanduser().exists() or _snapshot(repo_id, revision) is not None:
        return
    raise RepoNotAvailableOfflineError(_offline_message(repo_id, revision))


def try_to_load_from_cache(repo_id: str, filename: str, revision: str | None = DEFAULT_REVISION) -> str | Any | None:
    """``huggingface_hub.try_to_load_from_cache`` after checking the repo is readable offline.

    Returns the cached file's path, ``huggingface_hub``'s "known not to exist"
    sentinel, or None when the cache knows nothing of the file.

    Raises:
        RepoNotAvailableOfflineError: the repo is not in the cache.
    """
    validate_hf_repo_access(repo_id=repo_id, revision=revision)
    return huggingface_hub.try_to_load_from_cache(
        repo_id=repo_id, filename=filename, cache_dir=hf_cache_dir(), revision=revision
    )


def download_weight_files(
    huggingface_model_id: str,
    filenames: list[str],
    revision: str | None = None,
    force_download: bool = False,
    max_workers: int = 8,
) -> list[Path]:
    """The local paths of ``filenames`` of a repo: as given when they exist, else in the folder or the cache.

    Nothing is downloaded (``force_download`` and ``max_workers`` are accepted
    for MAX's signature; a forced download is logged and the cached copy used).

    Raises:
        WeightFilesNotAvailableError: some files are neither local nor cached (all are named).
        RepoNotAvailableOfflineError: the repo is neither a folder nor cached.

    Example:
        >>> [p.name for p in download_weight_files("tests/data/models/tiny_llama", ["model.safetensors"])]
        ['model.safetensors']
    """
    if force_download:
        logger.warning(
            "download_weight_files: force_download=True ignored: maxfx reads %s offline (local folder or Hugging Face "
            "cache)",
            huggingface_model_id,
        )
    if all(Path(f).exists() for f in filenames):
        return [Path(f) for f in filenames]
    repo = HuggingFaceRepo(huggingface_model_id, revision=revision or DEFAULT_REVISION)
    paths = [Path(name) if Path(name).exists() else repo.local_path / name for name in filenames]
    missing = [name for name, path in zip(filenames, paths) if not path.exists()]
    if missing:
        raise WeightFilesNotAvailableError(
            f"download_weight_files: {missing} not found in {repo.local_path} ({huggingface_model_id!r}); maxfx never "
            "downloads, so fetch them into the Hugging Face cache elsewhere"
        )
    return paths


# ─── a repo ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class HuggingFaceRepo:
    """A model repo read offline: a local folder, or a repo id in the Hugging Face cache.

    ``repo_type`` is inferred (``local`` when ``repo_id`` is an existing path).
    File names are relative to the repo (`local_path`, a maxfx addition, is
    the folder or the cache snapshot they are in).

    Raises:
        RepoNotAvailableOfflineError: an online repo that is not in the cache.

    Example:
        >>> repo = HuggingFaceRepo("tests/data/models/tiny_gpt2")
        >>> [f.value for f in repo.formats_available], repo.encoding_for_file("model.safetensors")
        (['safetensors', 'pytorch'], <SupportedEncoding.float32: 'float32'>)
    """

    repo_id: str
    revision: str = DEFAULT_REVISION
    trust_remote_code: bool = False
    repo_type: RepoType | None = None
    _root: Path = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        repo_id = str(self.repo_id)
        object.__setattr__(self, "repo_id", repo_id)
        repo_type = self.repo_type
        if repo_type is None:
            repo_type = RepoType.local if Path(repo_id).expanduser().exists() else RepoType.online
        repo_type = RepoType(repo_type)
        object.__setattr__(self, "repo_type", repo_type)
        if repo_type is RepoType.local:
            root = Path(repo_id).expanduser()
            if not root.is_dir():
                raise NotADirectoryError(f"HuggingFaceRepo: local repo {repo_id!r} is not a folder")
        else:
            snapshot = _snapshot(repo_id, self.revision)
            if snapshot is None:
                raise RepoNotAvailableOfflineError(_offline_message(repo_id, self.revision))
            root = snapshot
        object.__setattr__(self, "_root", root)

    def __str__(self) -> str:
        return self.repo_id

    def __repr__(self) -> str:
        return self.repo_id

    def __hash__(self) -> int:
        return hash((self.repo_id, self.revision, self.trust_remote_code, self.repo_type))

    @property
    def local_path(self) -> Path:
        """The folder holding the repo's files: the local folder, or the cache snapshot."""
        return self._root

    @cached_property
    def info(self) -> huggingface_hub.ModelInfo:
        """A ``huggingface_hub.ModelInfo`` built from the cached snapshot (id, commit, files, config).

        Raises:
            ValueError: for a local repo, as in MAX.
        """
        if self.repo_type is RepoType.local:
            raise ValueError(
                "HuggingFaceRepo.info: model info of a local repo is not supported (it describes a hub repo)"
            )
        siblings = [
            {"rfilename": str(p.relative_to(self._root)), "size": p.stat().st_size}
            for p in sorted(self._root.rglob("*"))
            if p.is_file()
        ]
        return huggingface_hub.ModelInfo(
            id=self.repo_id,
            sha=self._root.name,
            siblings=siblings,
            config=self._config_json(),
            private=False,
            downloads=0,
            likes=0,
            tags=[],
        )

    @cached_property
    def weight_files(self) -> dict[Any, list[str]]:
        """Weight files per `WeightsFormat` (``safetensors``, ``gguf``, ``pytorch``), names relative to the repo.

        Of several safetensors files, ``consolidated*`` ones are left out (as MAX does).
        """
        weights_format = _weights_format()
        found: dict[Any, list[str]] = {}
        safetensors = self._glob("*.safetensors")
        if len(safetensors) > 1:
            safetensors = [f for f in safetensors if "consolidated" not in f]
        for fmt, names in (
            (weights_format.safetensors, safetensors),
            (weights_format.gguf, self._glob("*.gguf")),
            (weights_format.pytorch, self._glob("*.bin")),
        ):
            if names:
                found[fmt] = names
        return found

    @property
    def formats_available(self) -> list[Any]:
        """The `WeightsFormat`s the repo has files of."""
        return list(self.weight_files)

    def size_of(self, filename: str) -> int | None:
        """Size in bytes of a repo file, or None when it is not local or cached."""
        path = self._root / filename
        return path.stat().st_size if path.is_file() else None

    def file_exists(self, filename: str) -> bool:
        """Whether the repo has ``filename`` (locally or in the cache)."""
        return (self._root / filename).is_file()

    def download(self, filename: str, force_download: bool = False) -> Path:
        """The local path of ``filename`` (never downloaded; see `download_weight_files`)."""
        return download_weight_files(self.repo_id, [filename], revision=self.revision, force_download=force_download)[0]

    @cached_property
    def supported_encodings(self) -> list[SupportedEncoding]:
        """Encodings found: GGUF names or headers, the safetensors header's dtypes, ``config.json``'s dtype for ``.bin``
        and GPTQ.
        """
        found: list[SupportedEncoding] = []
        for encoding in [
            *self._gguf_encodings.values(),
            *self._safetensors_encodings(),
            *self._pytorch_encodings(),
            *self._gptq_encodings(),
        ]:
            if encoding not in found:
                found.append(encoding)
        return found

    def encoding_for_file(self, file: str | Path) -> SupportedEncoding:
        """The encoding of one weight file of the repo.

        Raises:
            ValueError: the file is not ``.gguf``, ``.safetensors`` or ``.bin``, or its encoding cannot be told.
        """
        name = str(file)
        if name.endswith(".gguf"):
            encoding = SupportedEncoding.parse_from_file_name(Path(name).name) or _gguf_header_encoding(
                self._root / name if not Path(name).is_absolute() else Path(name)
            )
            if encoding is None:
                raise ValueError(
                    f"HuggingFaceRepo.encoding_for_file: cannot tell the encoding of GGUF file {name!r} (not in its "
                    "name nor its general.file_type)"
                )
            return encoding
        if name.endswith(".safetensors") or name.endswith(".bin"):
            encodings = self._safetensors_encodings() if name.endswith(".safetensors") else self._pytorch_encodings()
            if not encodings:
                raise ValueError(
                    f"HuggingFaceRepo.encoding_for_file: cannot tell the encoding of {name!r} in {self.repo_id!r} (no "
                    "float32/bfloat16/float8 tensors, or no torch_dtype in config.json)"
                )
            return encodings[0]
        raise ValueError(
            f"HuggingFaceRepo.encoding_for_file: weight path {name!r} is not .gguf, .safetensors or .bin; cannot infer "
            "its encoding"
        )

    def files_for_encoding(self, encoding: SupportedEncoding, weights_format: Any = None) -> dict[Any, list[Path]]:
        """Weight files per format that hold ``encoding`` (only ``weights_format``'s when given)."""
        fmt = _weights_format()
        encoding = SupportedEncoding(encoding)
        files: dict[Any, list[Path]] = {}
        gguf = [Path(n) for n, e in self._gguf_encodings.items() if e is encoding]
        if gguf:
            files[fmt.gguf] = gguf
        if encoding in self._safetensors_encodings() or encoding in self._gptq_encodings():
            files[fmt.safetensors] = [Path(n) for n in self.weight_files.get(fmt.safetensors, [])]
        if encoding in self._pytorch_encodings():
            files[fmt.pytorch] = [Path(n) for n in self.weight_files[fmt.pytorch]]
        if weights_format is not None:
            return {k: v for k, v in files.items() if k == weights_format}
        return files

    # ─── helpers ──────────────────────────────────────────────────────────────

    def _glob(self, pattern: str) -> list[str]:
        return sorted(str(p.relative_to(self._root)) for p in self._root.glob(pattern) if p.is_file())

    def _config_json(self) -> dict[str, Any]:
        path = self._root / "config.json"
        if not path.is_file():
            return {}
        try:
            return read_json_file(path)
        except (OSError, ValueError) as err:
            raise ValueError(f"HuggingFaceRepo: {path} is not valid JSON: {err}") from err

    @cached_property
    def _gguf_encodings(self) -> dict[str, SupportedEncoding]:
        out = {}
        for name in self.weight_files.get(_weights_format().gguf, []):
            encoding = SupportedEncoding.parse_from_file_name(Path(name).name) or _gguf_header_encoding(
                self._root / name
            )
            if encoding is not None:
                out[name] = encoding
        return out

    @cached_property
    def _safetensors_found(self) -> list[SupportedEncoding]:
        names = self.weight_files.get(_weights_format().safetensors, [])
        if not names:
            return []
        found: list[SupportedEncoding] = []
        for dtype in _safetensors_dtypes(self._root / names[0]):
            encoding = _SAFETENSORS_DTYPES.get(dtype)
            if encoding is None:
                if dtype not in _NEUTRAL_DTYPES:
                    logger.warning(
                        "HuggingFaceRepo: %s holds %s tensors, which no SupportedEncoding describes", names[0], dtype
                    )
            elif encoding not in found:
                found.append(encoding)
        return found

    def _safetensors_encodings(self) -> list[SupportedEncoding]:
        return [] if self._gptq_encodings() else self._safetensors_found

    def _pytorch_encodings(self) -> list[SupportedEncoding]:
        if _weights_format().pytorch not in self.weight_files:
            return []
        config = self._config_json()
        dtype = config.get("torch_dtype") or config.get("dtype")
        encoding = {"float32": SupportedEncoding.float32, "bfloat16": SupportedEncoding.bfloat16}.get(
            str(dtype).removeprefix("torch.")
        )
        if encoding is None:
            logger.warning(
                "HuggingFaceRepo: cannot tell the encoding of the .bin files of %s: config.json has torch_dtype %r",
                self.repo_id,
                dtype,
            )
            return []
        return [encoding]

    def _gptq_encodings(self) -> list[SupportedEncoding]:
        quant = self._config_json().get("quantization_config") or {}
        return [SupportedEncoding.gptq] if isinstance(quant, dict) and quant.get("quant_method") == "gptq" else []


def _safetensors_dtypes(path: Path) -> list[str]:
    """The tensor dtypes a safetensors header lists, in order of first appearance."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as err:
        raise ValueError(f"HuggingFaceRepo: cannot read the safetensors header of {path}: {err}") from err
    seen: list[str] = []
    for key, value in header.items():
        if key != "__metadata__" and isinstance(value, dict) and value.get("dtype") not in seen:
            seen.append(value.get("dtype"))
    return seen


def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (``general.architecture``, ``llama.context_length``...), tokenizer arrays
    left out.

    Raises:
        ValueError: the file is not a readable GGUF file.

    Example:
        >>> read_gguf_metadata("tests/data/models/tiny_llama/tiny_llama-q8_0.gguf")["general.file_type"]
        7
    """
    import gguf  # noqa: PLC0415 - slow to import (numpy readers); only GGUF metadata needs it

    try:
        # The bounded header scan first: a bare GGUFReader loops for minutes over an array claiming 2**60 elements.
        fields = open_reader(gguf, str(path)).fields
    except (OSError, ValueError) as err:
        raise ValueError(f"read_gguf_metadata: cannot read GGUF file {path}: {err}") from err
    return {key: f.contents() for key, f in fields.items() if not key.startswith(("GGUF.", "tokenizer."))}


def _gguf_header_encoding(path: Path) -> SupportedEncoding | None:
    """The encoding a GGUF file's ``general.file_type`` states, or None."""
    file_type = read_gguf_metadata(path).get("general.file_type")
    return None if file_type is None else SupportedEncoding.from_gguf_file_type(file_type)
