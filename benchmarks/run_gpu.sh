#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md on one H200: Llama-3-8B shape, bf16, random weights.
#   benchmarks/run_gpu.sh [b1|b2|b3|b4|b12|peer|all] [extra tessera flags...]
# Each part is one command of a few minutes (model load included) and writes
# benchmarks/results/<part>_h200.json (+ PNGs where matplotlib is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODEL=${MODEL:-benchmarks/configs/llama3-8b.json}
OUT=${OUT:-benchmarks/results}
SUFFIX=${SUFFIX:-h200}
part=${1:-all}
shift || true
common=(--model "$MODEL" --load-format dummy)
# Measured on the reference H200 (BENCHMARKS.md); pass MEASURE=1 to measure them in the run.
roof=(--bandwidth-gbps 4220 --peak-tflops 794)
[[ "${MEASURE:-0}" == 1 ]] && roof=()

run() { echo "+ $*" >&2; "$PY" -m tessera bench "$@"; }

case $part in
  b1|all) run latency "${common[@]}" "${roof[@]}" --out-dir "$OUT" --name "b1_$SUFFIX" "$@" ;;&
  b2|all) run offline "${common[@]}" "${roof[@]}" --no-progress --out-dir "$OUT" --name "b2_$SUFFIX" "$@" ;;&
  b3|all) run serving --workload B3 "${common[@]}" --out-dir "$OUT" --name "b3_$SUFFIX" "$@" ;;&
  b4|all) run serving --workload B4 "${common[@]}" --out-dir "$OUT" --name "b4_$SUFFIX" "$@" ;;&
  b12)    run quant "${common[@]}" --bandwidth-gbps 4220 --out-dir "$OUT" --name "b12_$SUFFIX" "$@" ;;
  peer)   run peer "${common[@]}" --batch-sizes 1,16,64 --out-dir "$OUT" --name "b1_peer_transformers_$SUFFIX" "$@" ;;
  b1|b2|b3|b4|all) ;;
  *) echo "usage: $0 [b1|b2|b3|b4|b12|peer|all] [flags]" >&2; exit 2 ;;
esac
