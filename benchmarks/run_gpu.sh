#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md on one H200: Llama-3-8B shape, bf16, random weights.
#   benchmarks/run_gpu.sh [PART...] [extra tessera flags...]   PART: b1 b2 b3 b4 b5 b5check tpar b7 b8 b9 b10 peer b11 b12 all
# (b11 runs the Mixtral-8x7B shape, benchmarks/configs/mixtral-8x7b.json, whatever MODEL says;
# b12 runs B12, bf16 beside fp8 and int4 weights and the fp8 KV cache; b10 starts `tessera
# serve` twice with graphs (dummy weights), then once from a real-size safetensors folder it
# writes (16 GB, deleted after; REAL=0 skips it); b9 runs plain, ngram and a 4-layer draft of
# the same width (DRAFT=config to change it) one engine after the other, its copy part on a
# 16 GB model of the shape that repeats its last token (a temporary folder, deleted after); b5 needs two GPUs: B1
# and B2 at TP=1, TP=2 and PP=2, one engine each, and b5_<suffix>.json with their ratios;
# b5check runs the two-GPU tests (one-shot all-reduce against NCCL, greedy parity of TP=2 and
# PP=2 with one GPU on the 4-layer shape) and keeps going if they fail; b7 needs two GPUs and
# the sglang-router wheel: B4's workload on `--dp-size 2` replicas behind the router against
# one replica, one run; tpar (two GPUs) measures one TP all-reduce inside a graph, NCCL against
# the one-shot path, 1-256 tokens of hidden 4096 (tp2_allreduce_<suffix>.json, under a
# minute); none of these is part of `all`)
# e.g. `benchmarks/run_gpu.sh b1 b2 b3`. Each part is one command of a few minutes (model load
# included) and writes benchmarks/results/<part>_h200.json (+ PNGs where matplotlib is
# installed). The flags go to every part.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODEL=${MODEL:-benchmarks/configs/llama3-8b.json}
OUT=${OUT:-benchmarks/results}
SUFFIX=${SUFFIX:-h200}
mkdir -p "$OUT"
parts=()
while [[ $# -gt 0 && $1 != -* ]]; do parts+=("$1"); shift; done
[[ ${#parts[@]} -gt 0 ]] || parts=(all)
for part in "${parts[@]}"; do
  case $part in
    b1|b2|b3|b4|b5|b5check|tpar|b7|b8|b9|b10|peer|b11|b12|all) ;;
    *) echo "usage: $0 [b1|b2|b3|b4|b5|b5check|tpar|b7|b8|b9|b10|peer|b11|b12|all ...] [flags]" >&2; exit 2 ;;
  esac
done
common=(--model "$MODEL" --load-format dummy)
# Measured on the reference H200 (BENCHMARKS.md); pass MEASURE=1 to measure them in the run.
roof=(--bandwidth-gbps 4220 --peak-tflops 794)
[[ "${MEASURE:-0}" == 1 ]] && roof=()

run() { echo "+ $*" >&2; "$PY" -m tessera bench "$@"; }

for part in "${parts[@]}"; do
  case $part in
    b1|all) run latency "${common[@]}" "${roof[@]}" --out-dir "$OUT" --name "b1_$SUFFIX" "$@" ;;&
    b2|all) run offline "${common[@]}" "${roof[@]}" --no-progress --out-dir "$OUT" --name "b2_$SUFFIX" "$@" ;;&
    b3|all) run serving --workload B3 "${common[@]}" --out-dir "$OUT" --name "b3_$SUFFIX" "$@" ;;&
    b4|all) run serving --workload B4 "${common[@]}" --out-dir "$OUT" --name "b4_$SUFFIX" "$@" ;;&
    b8|all) run serving --workload B8 "${common[@]}" --out-dir "$OUT" --name "b8_$SUFFIX" "$@" ;;&
    b9)     run spec "${common[@]}" --draft-model "${DRAFT:-benchmarks/configs/llama3-8b-4layer.json}" --out-dir "$OUT" --name "b9_$SUFFIX" "$@" ;;
    peer)   run peer "${common[@]}" --batch-sizes 1,16,64 --out-dir "$OUT" --name "b1_peer_transformers_$SUFFIX" "$@" ;;
    b7)     run b7 "${common[@]}" --out-dir "$OUT" --name "b7_$SUFFIX" "$@" ;;
    b10)    run startup "${common[@]}" --runs 2 $([[ "${REAL:-1}" == 1 ]] && echo --real-weights) --out-dir "$OUT" --name "b10_$SUFFIX" "$@" ;;
    b12)    run quant "${common[@]}" --bandwidth-gbps 4220 --out-dir "$OUT" --name "b12_$SUFFIX" "$@" ;;
    b5)     run b5 "${common[@]}" "${roof[@]}" --out-dir "$OUT" --suffix "$SUFFIX" "$@" ||
              echo "b5: some part failed (see errors in $OUT/b5_$SUFFIX.json)" >&2 ;;
    b5check) echo "+ pytest two-GPU checks" >&2
             "$PY" -m pytest -q -p no:cacheprovider tests/hal_cuda/test_nccl_gpu.py \
               tests/hal_cuda/test_parallel_parity_gpu.py "tests/hal_cuda/test_kernels_gpu.py::test_untuned_one_token_shape_is_measured_once_and_stays_correct" \
               2>&1 | tee "$OUT/b5check_$SUFFIX.log" ||
               echo "b5check: a test failed (see $OUT/b5check_$SUFFIX.log)" >&2 ;;
    tpar)   echo "+ tests/hal_cuda/allreduce_latency.py" >&2
            "$PY" tests/hal_cuda/allreduce_latency.py "$OUT/tp2_allreduce_$SUFFIX.json" ||
              echo "tpar: failed" >&2 ;;
    b11)    run b11 --model benchmarks/configs/mixtral-8x7b.json "${roof[@]}" --out-dir "$OUT" --suffix "$SUFFIX" "$@" ;;
    *) ;;
  esac
done
