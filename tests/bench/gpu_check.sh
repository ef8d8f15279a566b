#!/usr/bin/env bash
# One prepared GPU check for a lent device machine (../.library/device): the GPU
# kernel tests, the kernel benchmarks (Pallas vs XLA and cuDNN, in one process)
# and the showcase on the GPU, each under its own time limit so the whole run
# ends inside one call. Logs and JSON land in $OUT (default: tests/bench/results).
#
#   bash tests/bench/gpu_check.sh                       # ~9 minutes on an H100
#   STEPS="gpu_tests llm" bash tests/bench/gpu_check.sh  # a subset (info always runs)
#
# Step limits (seconds) are T_TESTS, T_KERNELS, T_QMATMUL, T_DEMO, T_LLM. On the
# first H100 run (2026-11-28) the tests took 165 s, kernels 94 s, qmatmul 75 s
# (cut by its own 70 s budget) and the demo 27 s; float32 flash kernels compile
# in ~13 s each. `llm` (the 1B Llama bf16 / Q4_0 decode benchmark) has not run yet.
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

want() { [[ " ${STEPS:-gpu_tests kernels qmatmul demo llm} " == *" $1 "* ]]; }

step info 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; $PY -c 'import jax; print(jax.__version__, jax.devices())'"
want gpu_tests && step gpu_tests "${T_TESTS:-240}" $PY -m pytest -m gpu tests/custom_calls -q -p no:cacheprovider --no-header -rfE
want kernels && step kernels "${T_KERNELS:-120}" $PY -m tests.bench.kernels --no-sweep --repeats 5 --out "$OUT/kernels.json"
want qmatmul && step qmatmul "${T_QMATMUL:-100}" $PY -m tests.bench.qmatmul_kernels --no-sweep --repeats 7 --budget-s 70 --out "$OUT/qmatmul.json"
want demo && step demo "${T_DEMO:-60}" env MAXFX_DEFAULT_DEVICE=gpu $PY -m maxfx.demo
if want llm; then
  step llm "${T_LLM:-180}" $PY -m tests.bench.llm --gpu --quick
  [ "$OUT" != tests/bench/results ] && cp -f tests/bench/results/llm.json "$OUT/" 2>/dev/null
fi
true
