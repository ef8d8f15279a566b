#!/usr/bin/env bash
# One prepared GPU check for a lent device machine (../.library/device): the GPU
# kernel tests, the kernel benchmarks (Pallas vs XLA and cuDNN, in one process)
# and the showcase on the GPU, each under its own time limit so the whole run
# ends inside one call. Logs and JSON land in $OUT (default: tests/bench/results).
#
#   bash tests/bench/gpu_check.sh            # ~7 minutes on an H100
#
# The device image has jax 0.11.2 with the CUDA plugin but not gguf: carry a
# wheel in .whl/ (see the device README); it is installed into /tmp/site here.
set -u
OUT=${OUT:-tests/bench/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_PLATFORMS= MAXFX_CPU_KERNELS=0
PY=${PY:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

step() {  # step NAME SECONDS CMD...: run CMD under a limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "   rc=$? in $((SECONDS - t0)) s"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}

step info 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; $PY -c 'import jax; print(jax.__version__, jax.devices())'"
step gpu_tests "${T_TESTS:-240}" $PY -m pytest -m gpu tests/kernels -q -p no:cacheprovider --no-header -rfE
step kernels "${T_KERNELS:-150}" $PY -m tests.bench.kernels --no-sweep --repeats 5 --out "$OUT/kernels.json"
step qmatmul "${T_QMATMUL:-100}" $PY -m tests.bench.qmatmul_kernels --no-sweep --repeats 7 --budget-s 70 --out "$OUT/qmatmul.json"
step demo "${T_DEMO:-60}" env MAXFX_DEFAULT_DEVICE=gpu $PY -m maxfx.demo
