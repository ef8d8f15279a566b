"""The offline H100 compile report (tests/bench/sm90_report.py): its capture phase runs on any CPU;
the compile phase runs where ``make sm90-report`` has built ``.venv-triton``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.bench import sm90_report
from tests.custom_calls._util import quiet_triton  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
TRITON_PY = ROOT / ".venv-triton" / "bin" / "python"
SUBSET = ["decode_b8_t8192", "qmatmul_Q4_0_m1"]


def test_capture_writes_the_triton_module_of_each_kernel(tmp_path):
    records = sm90_report.capture(str(tmp_path), only=SUBSET)
    assert [(r["case"], r["kernel"]) for r in records] == [
        ("decode_b8_t8192", "decode_attention"),
        ("qmatmul_Q4_0_m1", "qmatmul_q4_0"),
    ]
    decode = records[0]
    # launch parameters as the dispatch chose them: B·Hkv·splits ≥ 264 programs, DecodeConfig's warps/stages
    assert (decode["num_warps"], decode["num_stages"]) == (4, 2)
    assert decode["grid_x"] * decode["grid_y"] * decode["grid_z"] >= 264
    ttir = (tmp_path / decode["file"]).read_text()
    assert "tt.func public @decode_attention" in ttir and "tt.dot" in ttir
    assert json.loads((tmp_path / (decode["file"] + ".json")).read_text())["kernel"] == "decode_attention"


def test_occupancy_is_limited_by_registers_and_shared_memory():
    assert sm90_report._occupancy(8, 255, 160 * 1024) == 1  # 8 warps x 255 registers fill the register file
    assert sm90_report._occupancy(4, 122, 72 * 1024) == 3  # registers would allow 4; 228 KiB of smem allows 3
    assert sm90_report._occupancy(4, 64, 0) == 8
    assert sm90_report._occupancy(4, None, 1024) is None


def test_missing_triton_python_skips_with_a_hint(tmp_path, capsys):
    assert sm90_report.main(["--triton-python", str(tmp_path / "none")]) == []
    assert "make sm90-report" in capsys.readouterr().out


@pytest.mark.skipif(not TRITON_PY.exists(), reason="no .venv-triton (make sm90-report builds it)")
def test_compiled_kernels_fit_an_h100(tmp_path):
    sm90_report.capture(str(tmp_path), only=SUBSET)
    out = subprocess.run(
        [str(TRITON_PY), sm90_report.__file__, "--compile", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    results = {r["case"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}
    for r in results.values():
        assert r["ok"] and r["fits_smem"] and r["spill_store_bytes"] == 0, r
    assert results["decode_b8_t8192"]["mma"] == "mma.sync"  # the QK^T and PV dots run on tensor cores
    assert results["qmatmul_Q4_0_m1"]["mma"] == "none"  # M = 1 is a GEMV: FMA, no MMA
