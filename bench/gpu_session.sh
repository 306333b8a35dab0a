#!/usr/bin/env bash
# The GPU checks of docs/gpu_runtime.md ("Running the GPU tests and the benchmark on a lent device") as one
# command per phase, so a device call is `bash bench/gpu_session.sh PHASE` (carry .whl for islpy):
#
#   tests  pytest -m gpu (test_runtime_gpu, test_sm90_gpu, test_fp64_gpu) -> $OUT/gpu_tests.log
#   bench  bench/bench_gpu.py, every workload against torch   -> $OUT/RESULTS_gpu.md, bench_gpu.json, bench.log
#   sweep  the GEMM tile sweep (TILES below)                  -> $OUT/RESULTS_tiles.md, tiles.json, tiles.log
#   nets   bench/models_gpu.py: the four networks in fp16, batch 1, against PyTorch eager and CUDA Graphs
#                                                             -> $OUT/RESULTS_nets.md, nets.json, nets.log
#
# Each phase fits one call's 10 minutes on an H100; run them as separate calls (or `tests,bench` together
# when the cubin cache is warm). Wheels in .whl/ (islpy, and cuda-bindings where the image lacks it) are
# installed into /tmp/site first. Without a GPU every phase still runs and says so (the tests skip, the
# bench exits 0), which is how it is checked here.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kumiko_gpu_out}
mkdir -p "$OUT"
TILES=${TILES:-128x128x32/64x64/4/registers,128x128x32/64x64/4/g1,128x128x64/64x64/3,128x128x64/64x64/3/registers,128x256x32/64x64/3,256x128x32/64x64/3,64x64x32/32x32/3}
export PYTHONUNBUFFERED=1 KUMIKO_CACHE=${KUMIKO_CACHE:-/tmp/kc}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_session: installing .whl/ failed" >&2; exit 2; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
(nvidia-smi -L || echo "no nvidia-smi") 2>&1 | tee "$OUT/device.txt"
rc=0
for phase in ${1//,/ }; do
  case $phase in
    tests)
      python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -n 8 --timeout 90 -m gpu -rs \
        tests/gpu/test_runtime_gpu.py tests/gpu/test_sm90_gpu.py tests/gpu/test_fp64_gpu.py 2>&1 \
        | tee "$OUT/gpu_tests.log" || rc=1 ;;
    bench)
      python3 bench/bench_gpu.py --reps 20 --archs "${ARCHS:-}" --results "$OUT/RESULTS_gpu.md" --json "$OUT/bench_gpu.json" 2>&1 \
        | tee "$OUT/bench.log" || rc=1 ;;
    sweep)
      python3 bench/bench_gpu.py --workloads gemm-4096,gemm-8192 --reps 10 --no-append --tiles "$TILES" \
        --results "$OUT/RESULTS_tiles.md" --json "$OUT/tiles.json" 2>&1 | tee "$OUT/tiles.log" || rc=1 ;;
    nets)
      python3 bench/models_gpu.py --reps 20 --cuda-graph --profile 8 --no-append --cache "$OUT/onnx" \
        --results "$OUT/RESULTS_nets.md" --json "$OUT/nets.json" 2>&1 | tee "$OUT/nets.log" || rc=1 ;;
    *)
      echo "usage: bash bench/gpu_session.sh tests|bench|sweep|nets[,...]" >&2; exit 2 ;;
  esac
done
exit $rc
