"""maxfx.pipelines.lib.hf_utils: local folders and a Hugging Face cache, read strictly offline."""

import json
import shutil
import struct
from pathlib import Path

import huggingface_hub
import pytest

from maxfx.graph.weights import WeightsFormat
from maxfx.pipelines.lib.config import PipelineConfig, SupportedEncoding
from maxfx.pipelines.lib.hf_utils import (
    HuggingFaceRepo,
    RepoNotAvailableOfflineError,
    RepoType,
    WeightFilesNotAvailableError,
    download_weight_files,
    generate_local_model_path,
    hf_cache_dir,
    read_gguf_metadata,
    try_to_load_from_cache,
    validate_hf_repo_access,
)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "models"
LLAMA = str(MODELS / "tiny_llama")
GPT2 = str(MODELS / "tiny_gpt2")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every hub call that could reach the network fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("hf_utils reached for the network")

    for name in (
        "hf_hub_download",
        "model_info",
        "revision_exists",
        "file_exists",
        "get_hf_file_metadata",
        "snapshot_download",
        "list_repo_files",
    ):
        monkeypatch.setattr(huggingface_hub, name, refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A Hugging Face cache (HF_HUB_CACHE) holding 'tiny-org/tiny-llama' at 'main' -> COMMIT, files as blob symlinks."""
    hub = tmp_path / "hub"
    repo = hub / "models--tiny-org--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name in ("config.json", "model.safetensors", "tiny_llama-q8_0.gguf", "tokenizer.json"):
        blob = repo / "blobs" / f"blob-{name}"
        shutil.copy(Path(LLAMA) / name, blob)
        (snapshot / name).symlink_to(Path("..", "..", "blobs", blob.name))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return snapshot


# ─── a local folder ───────────────────────────────────────────────────────────


def test_local_folder_weights_and_encodings():
    repo = HuggingFaceRepo(LLAMA)
    assert repo.repo_type is RepoType.local and repo.local_path == Path(LLAMA) and str(repo) == LLAMA
    assert repo.weight_files == {
        WeightsFormat.safetensors: ["model.safetensors"],
        WeightsFormat.gguf: ["tiny_llama-q4_0.gguf", "tiny_llama-q8_0.gguf"],
        WeightsFormat.pytorch: ["pytorch_model.bin"],
    }
    assert repo.formats_available == [WeightsFormat.safetensors, WeightsFormat.gguf, WeightsFormat.pytorch]
    assert repo.supported_encodings == [SupportedEncoding.q4_0, SupportedEncoding.q8_0, SupportedEncoding.float32]
    assert repo.files_for_encoding(SupportedEncoding.q8_0) == {WeightsFormat.gguf: [Path("tiny_llama-q8_0.gguf")]}
    assert repo.files_for_encoding(SupportedEncoding.float32) == {
        WeightsFormat.safetensors: [Path("model.safetensors")],
        WeightsFormat.pytorch: [Path("pytorch_model.bin")],
    }
    assert repo.files_for_encoding("float32", WeightsFormat.pytorch) == {
        WeightsFormat.pytorch: [Path("pytorch_model.bin")]
    }
    assert repo.files_for_encoding(SupportedEncoding.q4_k) == {}


def test_local_folder_files():
    repo = HuggingFaceRepo(GPT2)
    assert repo.supported_encodings == [SupportedEncoding.float32]
    assert repo.encoding_for_file("model.safetensors") is SupportedEncoding.float32
    assert repo.encoding_for_file("pytorch_model.bin") is SupportedEncoding.float32  # config.json's torch_dtype
    assert repo.file_exists("config.json") and not repo.file_exists("nope.json")
    assert (
        repo.size_of("model.safetensors") == (Path(GPT2) / "model.safetensors").stat().st_size
        and repo.size_of("nope") is None
    )
    with pytest.raises(ValueError, match="not .gguf, .safetensors or .bin"):
        repo.encoding_for_file("config.json")
    with pytest.raises(ValueError, match="model info of a local repo is not supported"):
        repo.info
    assert HuggingFaceRepo(LLAMA).encoding_for_file("tiny_llama-q4_0.gguf") is SupportedEncoding.q4_0


def test_gguf_encoding_from_the_header_when_the_name_says_none(tmp_path):
    shutil.copy(Path(LLAMA) / "tiny_llama-q4_0.gguf", tmp_path / "model.gguf")
    repo = HuggingFaceRepo(str(tmp_path))
    assert (
        repo.supported_encodings == [SupportedEncoding.q4_0]
        and repo.encoding_for_file("model.gguf") is SupportedEncoding.q4_0
    )
    meta = read_gguf_metadata(tmp_path / "model.gguf")
    assert (
        meta["general.architecture"] == "llama"
        and meta["general.file_type"] == 2
        and not any(k.startswith("tokenizer.") for k in meta)
    )


def _safetensors(path: Path, dtypes: list[str]) -> None:
    header = {f"t{i}": {"dtype": d, "shape": [1], "data_offsets": [2 * i, 2 * i + 2]} for i, d in enumerate(dtypes)}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (2 * len(dtypes)))


def test_safetensors_dtypes_and_gptq(tmp_path):
    _safetensors(tmp_path / "model.safetensors", ["BF16", "I64", "F32"])
    assert HuggingFaceRepo(str(tmp_path)).supported_encodings == [SupportedEncoding.bfloat16, SupportedEncoding.float32]
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    _safetensors(gptq / "model.safetensors", ["I32", "F16"])
    (gptq / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "bits": 4}}))
    repo = HuggingFaceRepo(str(gptq))
    assert repo.supported_encodings == [SupportedEncoding.gptq]
    assert repo.files_for_encoding(SupportedEncoding.gptq) == {WeightsFormat.safetensors: [Path("model.safetensors")]}


def test_consolidated_safetensors_are_left_out_of_several(tmp_path):
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "consolidated.safetensors"):
        _safetensors(tmp_path / name, ["F32"])
    assert HuggingFaceRepo(str(tmp_path)).weight_files[WeightsFormat.safetensors] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


def test_download_weight_files_returns_local_files():
    assert download_weight_files(LLAMA, ["model.safetensors", "tiny_llama-q8_0.gguf"]) == [
        Path(LLAMA) / "model.safetensors",
        Path(LLAMA) / "tiny_llama-q8_0.gguf",
    ]
    given = str(Path(LLAMA) / "config.json")
    assert download_weight_files("anything", [given]) == [Path(given)]
    with pytest.raises(WeightFilesNotAvailableError, match=r"\['missing\.safetensors'\] not found"):
        download_weight_files(LLAMA, ["model.safetensors", "missing.safetensors"])


# ─── the Hugging Face cache ───────────────────────────────────────────────────


def test_a_cached_repo_is_read_from_its_snapshot(hf_cache):
    repo = HuggingFaceRepo("tiny-org/tiny-llama")
    assert repo.repo_type is RepoType.online and repo.local_path == hf_cache
    assert repo.weight_files == {
        WeightsFormat.safetensors: ["model.safetensors"],
        WeightsFormat.gguf: ["tiny_llama-q8_0.gguf"],
    }
    assert repo.supported_encodings == [SupportedEncoding.q8_0, SupportedEncoding.float32]
    assert (
        repo.file_exists("tokenizer.json")
        and repo.size_of("config.json") == (Path(LLAMA) / "config.json").stat().st_size
    )
    info = repo.info
    assert (info.id, info.sha) == ("tiny-org/tiny-llama", COMMIT) and info.config["architectures"] == [
        "LlamaForCausalLM"
    ]
    assert sorted(s.rfilename for s in info.siblings) == [
        "config.json",
        "model.safetensors",
        "tiny_llama-q8_0.gguf",
        "tokenizer.json",
    ]
    assert HuggingFaceRepo("tiny-org/tiny-llama", revision=COMMIT).local_path == hf_cache


def test_cache_functions(hf_cache):
    assert generate_local_model_path("tiny-org/tiny-llama", COMMIT) == str(hf_cache)
    assert generate_local_model_path("tiny-org/tiny-llama", "main") == str(hf_cache)
    with pytest.raises(FileNotFoundError, match="Model path does not exist"):
        generate_local_model_path("tiny-org/tiny-llama", "v2")
    validate_hf_repo_access("tiny-org/tiny-llama", "main")
    assert try_to_load_from_cache("tiny-org/tiny-llama", "config.json", "main") == str(hf_cache / "config.json")
    assert try_to_load_from_cache("tiny-org/tiny-llama", "absent.json", "main") is None
    assert download_weight_files("tiny-org/tiny-llama", ["model.safetensors"], revision="main") == [
        hf_cache / "model.safetensors"
    ]
    with pytest.raises(WeightFilesNotAvailableError, match="maxfx never downloads"):
        download_weight_files("tiny-org/tiny-llama", ["pytorch_model.bin"])


def test_an_uncached_repo_is_not_available_offline(hf_cache):
    for call in (
        lambda: HuggingFaceRepo("other-org/model"),
        lambda: validate_hf_repo_access("other-org/model", "main"),
        lambda: try_to_load_from_cache("other-org/model", "config.json", "main"),
        lambda: HuggingFaceRepo("tiny-org/tiny-llama", revision="v2"),
        lambda: download_weight_files("other-org/model", ["model.safetensors"]),
    ):
        with pytest.raises(
            RepoNotAvailableOfflineError,
            match=(
                r"is not available offline: it is not a local folder and not in the Hugging Face cache at "
                r".*hub.*huggingface-cli download"
            ),
        ):
            call()


def test_pipeline_config_loads_a_cached_repo(hf_cache):
    config = PipelineConfig(model_path="tiny-org/tiny-llama", quantization_encoding="q8_0")
    m = config.model_config
    assert m.local_model_path == hf_cache / "tiny_llama-q8_0.gguf" and config.max_length == 128
    assert PipelineConfig(model_path="tiny-org/tiny-llama").model_config.local_model_path == hf_cache
    by_file = PipelineConfig(weight_path=["tiny-org/tiny-llama/model.safetensors"])
    assert (
        by_file.model_config.model_path == "tiny-org/tiny-llama"
        and by_file.model_config.resolved_weight_paths() == [hf_cache / "model.safetensors"]
    )


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "a"))
    assert hf_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.delenv("HF_HOME")
    assert hf_cache_dir() == Path("~/.cache/huggingface/hub").expanduser()
