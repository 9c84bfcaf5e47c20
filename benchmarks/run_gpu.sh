#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md on one H200: Llama-3-8B shape, bf16, random weights.
#   benchmarks/run_gpu.sh [PART...] [extra tessera flags...]
#   PART: b1 b2 b3 b4 b5 b5check tpar b7 b8 b9 b10 peer b11 b12 profile gputests multihost
#         fusion all
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
# minute); profile is the step profile of docs/performance.md (tests/hal_cuda/
# gpu_step_profile.py, into $OUT/step_profile_<suffix>/; about 10 minutes whole, PROFILE_ONLY=
# "steps ttft traces" for some of its parts); gputests runs the one-GPU tests
# still to confirm (model families' parity, gemma2 included, and the mixed-step graphs) and
# multihost the two-GPU two-launcher test, each with its log in $OUT; fusion is the A/B of
# the cuda plugin's fused ops (docs/performance.md): their GPU tests and conformance cases
# (fusion_<suffix>.log), each fused kernel timed against the kernels it replaces
# (fused_kernels_<suffix>.json, tests/hal_cuda/fused_bench.py), then B1 with every fusion off (HAL_CUDA_UNFUSE=all,
# b1_unfused_<suffix>.json) and on (b1_fused_<suffix>.json), and b1_fusion_<suffix>.json with
# both decode figures and their difference (about 100 s); none of these is part of `all`)
# e.g. `benchmarks/run_gpu.sh b1 b2 b3`. Each part is one command of a few minutes (model load
# included) and writes benchmarks/results/<part>_h200.json (+ PNGs where matplotlib is
# installed). The flags go to every part.
#
# DRY=1: a dry run on a machine without a GPU. Every part runs end to end on the cpu plugin
# with tiny random configs (benchmarks/configs/tiny-*.json) and tiny workloads, so a crash, a
# missing import, a bad argument or a wrong path shows before GPU time is spent on it. The
# Triton kernels a part times directly run in Triton's interpreter; scripts/gpu_env on
# PYTHONPATH refuses the packages the GPU machine lacks (GPU_ENV=0 lets them be). Results go
# to $OUT (default: a temporary folder, never benchmarks/results) with the suffix "dry".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=${DRY:-0}
if [[ $DRY == 1 ]]; then
  MODEL=${MODEL:-benchmarks/configs/tiny-llama.json}
  MOE_MODEL=${MOE_MODEL:-benchmarks/configs/tiny-mixtral.json}
  DRAFT=${DRAFT:-benchmarks/configs/tiny-llama-1layer.json}
  OUT=${OUT:-${TMPDIR:-/tmp}/tessera-dry-run}
  SUFFIX=${SUFFIX:-dry}
  export TRITON_INTERPRET=1
  if [[ ${GPU_ENV:-1} == 1 ]]; then
    export PYTHONPATH="$PWD/scripts/gpu_env${PYTHONPATH:+:$PYTHONPATH}"
  fi
else
  MODEL=${MODEL:-benchmarks/configs/llama3-8b.json}
  MOE_MODEL=${MOE_MODEL:-benchmarks/configs/mixtral-8x7b.json}
  DRAFT=${DRAFT:-benchmarks/configs/llama3-8b-4layer.json}
  OUT=${OUT:-benchmarks/results}
  SUFFIX=${SUFFIX:-h200}
fi
mkdir -p "$OUT"
parts=()
while [[ $# -gt 0 && $1 != -* ]]; do parts+=("$1"); shift; done
[[ ${#parts[@]} -gt 0 ]] || parts=(all)
all_parts="b1|b2|b3|b4|b5|b5check|tpar|b7|b8|b9|b10|peer|b11|b12|profile|gputests|multihost|inputs|fusion|kernels|quanttests|moetests|quantbench|gemvsweep|attnbench|attnorder|attnregs|ncu|pdlbench|hop|nativeprobe|int4mmaprobe|fusionprobe|tokengemm|tokengemmtests|nativeattn|nativeattnprobe|nativeattntests|all"
for part in "${parts[@]}"; do
  if [[ ! $part =~ ^($all_parts)$ ]]; then
    echo "usage: $0 [${all_parts//|/|} ...] [flags]" >&2
    exit 2
  fi
done
common=(--model "$MODEL" --load-format dummy)
# Measured on the reference H200 (BENCHMARKS.md); pass MEASURE=1 to measure them in the run.
roof=(--bandwidth-gbps 4220 --peak-tflops 794)
bw=(--bandwidth-gbps 4220)  # B12's bound: bandwidth alone
[[ "${MEASURE:-0}" == 1 ]] && roof=() && bw=()

# The dry run's tiny workloads: each part's own flags, before the ones given on the command
# line (which win). Empty on the GPU.
T_b1=() T_b2=() T_b3=() T_b4=() T_b5=() T_b7=() T_b8=() T_b9=() T_b10=() T_b11=() T_b12=()
T_peer=() T_cpu=() T_pytest=() T_gputests=() T_multihost=() T_fusion=() T_kernels=()
T_quanttests=() T_moetests=() T_tokengemmtests=() T_nativeattntests=()
if [[ $DRY == 1 ]]; then
  T_b1=(--prompt-len 32 --output-len 8 --iters 1 --warmup 1)
  T_b2=(--num-requests 4 --prompt-len 16,32 --output-len 8,16)
  T_b3=(--concurrency 1,2 --requests-per-concurrency 1 --min-requests 2 --prompt-len 16,32
        --output-len 4,8 --warmup 1)
  T_b4=(--concurrency 4 --groups 2 --group-size 2 --prefix-len 32 --suffix-len 8
        --prefix-output-len 4 --warmup 1)
  T_b7=("${T_b4[@]}")
  T_b8=(--concurrency 2 --requests-per-concurrency 1 --min-requests 2 --prompt-len 16,32
        --output-len 8,16 --warmup 1)
  T_b9=(--prompt-len 32 --output-len 16 --iters 1 --warmup 1)
  T_b10=(--runs 1)
  T_b11=(--b1-flags "${T_b1[*]}" --b2-flags "${T_b2[*]}"
         --kernel-flags "--tokens 16 --iters 2 --warmup 1 --compute-tokens 64")
  T_b12=(--prompt-len 32 --output-len 8 --iters 1 --warmup 1 --num-requests 4
         --b2-prompt-len 16,32 --b2-output-len 8,16 --kv-pool-tokens 1024 --kl-prompts 2
         --kl-prompt-len 8,16)
  T_b5=(--num-requests 4 --iters 1 --warmup 1 --b1-flags "--prompt-len 32 --output-len 8"
        --b2-flags "--prompt-len 16,32 --output-len 8,16")
  T_peer=(--prompt-len 32 --output-len 8 --iters 1 --warmup 1)
  T_cpu=(--cpu)
  # A pytest plugin installed here but not there (its imports are refused by scripts/gpu_env).
  T_pytest=(-p no:schemathesis)
  # The GPU tests skip here: their cpu twins run instead, with the GPU machine's packages.
  T_gputests=(tests/worker_proc/test_graph_mixed.py tests/worker_proc/test_parity_tiny.py
              -k "gemma2 or mixed or Mixed")
  T_multihost=("tests/bus/test_multihost.py::test_two_hosts_give_the_tokens_of_one")
  # The fused kernels in Triton's interpreter against their references.
  T_fusion=(tests/hal_cuda/test_fused_interpreted.py)
  # The kernels in Triton's interpreter, and the launches' specializations.
  T_kernels=(tests/hal_cuda/test_kernels_interpreted.py tests/hal_cuda/test_kernel_variants.py)
  # The quantized kernels in Triton's interpreter.
  T_quanttests=(tests/hal_cuda/test_quant_interpreted.py -k "qgemm")
  # The MoE kernels in Triton's interpreter (the -k above selects them).
  T_moetests=(tests/hal_cuda/test_kernels_interpreted.py)
  # The token GEMM in Triton's interpreter.
  T_tokengemmtests=(tests/hal_cuda/test_token_gemm_interpreted.py)
  T_nativeattntests=(tests/hal_cuda/test_native_attention_cpu_side.py)
fi

run() { echo "+ $*" >&2; "$PY" -m tessera bench "$@"; }

# Nsight Compute's full set of sections over the kernels of tests/hal_cuda/ncu_kernels.py
# (NCU_TARGETS: attention, linears), the clocks left alone: each target's report, its
# details page, every metric (raw, csv) and, for the Triton kernels, the SASS with its stall
# samples a line (source, csv), into ncu_$SUFFIX/. Needs the GPU and ncu: skipped otherwise.
ncu_part() {
  local dir="$OUT/ncu_$SUFFIX" bin target
  bin=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)}
  if [[ $DRY == 1 || -z $bin ]]; then
    echo "ncu: skipped (needs the GPU and Nsight Compute)" >&2
    return
  fi
  mkdir -p "$dir"
  for target in ${NCU_TARGETS:-attention linears}; do
    echo "+ $bin ... tests/hal_cuda/ncu_kernels.py $target" >&2
    if ! "$bin" --clock-control none --set full --import-source yes --nvtx --nvtx-include "ncu/" \
        -f -o "$dir/$target" "$PY" tests/hal_cuda/ncu_kernels.py "$target" >"$dir/$target.log" 2>&1; then
      tail -20 "$dir/$target.log" >&2
      failed+=("ncu_$target")
      continue
    fi
    "$bin" --import "$dir/$target.ncu-rep" --page details >"$dir/${target}_details.txt" 2>&1 || true
    "$bin" --import "$dir/$target.ncu-rep" --page raw --csv >"$dir/${target}_raw.csv" 2>&1 || true
    "$bin" --import "$dir/$target.ncu-rep" --page source --csv --print-source sass \
      >"$dir/${target}_source.csv" 2>&1 || true
    grep -E "^  [A-Za-z_].*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)" \
      "$dir/${target}_details.txt" | head -200 >&2 || true
  done
}
# Parts that keep the others going when they fail (the tests, b5, tpar, profile): named at the
# end, and the exit code says so.
failed=()

# pytest over GPU test files, its log in $OUT; a failure is reported, not fatal.
gpu_pytest() {
  local name=$1; shift
  echo "+ pytest $*" >&2
  "$PY" -m pytest -q -p no:cacheprovider "${T_pytest[@]}" "$@" 2>&1 |
    tee "$OUT/${name}_$SUFFIX.log" ||
    { echo "$name: a test failed (see $OUT/${name}_$SUFFIX.log)" >&2; failed+=("$name"); }
}

for part in "${parts[@]}"; do
  case $part in
    b1|all) run latency "${common[@]}" "${roof[@]}" "${T_b1[@]}" --out-dir "$OUT" --name "b1_$SUFFIX" "$@" ;;&
    b2|all) run offline "${common[@]}" "${roof[@]}" --no-progress "${T_b2[@]}" --out-dir "$OUT" --name "b2_$SUFFIX" "$@" ;;&
    b3|all) run serving --workload B3 "${common[@]}" "${T_b3[@]}" --out-dir "$OUT" --name "b3_$SUFFIX" "$@" ;;&
    b4|all) run serving --workload B4 "${common[@]}" "${T_b4[@]}" --out-dir "$OUT" --name "b4_$SUFFIX" "$@" ;;&
    b8|all) run serving --workload B8 "${common[@]}" "${T_b8[@]}" --out-dir "$OUT" --name "b8_$SUFFIX" "$@" ;;&
    b9)     run spec "${common[@]}" --draft-model "$DRAFT" "${T_b9[@]}" --out-dir "$OUT" --name "b9_$SUFFIX" "$@" ;;
    peer)   run peer "${common[@]}" --batch-sizes 1,16,64 "${T_peer[@]}" --out-dir "$OUT" --name "b1_peer_transformers_$SUFFIX" "$@" ;;
    b7)     run b7 "${common[@]}" "${T_b7[@]}" --out-dir "$OUT" --name "b7_$SUFFIX" "$@" ;;
    b10)    run startup "${common[@]}" --runs 2 $([[ "${REAL:-1}" == 1 ]] && echo --real-weights) "${T_b10[@]}" --out-dir "$OUT" --name "b10_$SUFFIX" "$@" ;;
    b12)    run quant "${common[@]}" "${bw[@]}" "${T_b12[@]}" --out-dir "$OUT" --name "b12_$SUFFIX" "$@" ;;
    b5)     run b5 "${common[@]}" "${roof[@]}" "${T_b5[@]}" --out-dir "$OUT" --suffix "$SUFFIX" "$@" ||
              { echo "b5: some part failed (see errors in $OUT/b5_$SUFFIX.json)" >&2; failed+=(b5); } ;;
    b5check) gpu_pytest b5check tests/hal_cuda/test_nccl_gpu.py \
               tests/hal_cuda/test_parallel_parity_gpu.py \
               "tests/hal_cuda/test_conformance_gpu.py::test_communicator_two_processes" \
               "tests/hal_cuda/test_kernels_gpu.py::test_untuned_one_token_shape_is_measured_once_and_stays_correct" ;;
    tpar)   echo "+ tests/hal_cuda/allreduce_latency.py" >&2
            "$PY" tests/hal_cuda/allreduce_latency.py "$OUT/tp2_allreduce_$SUFFIX.json" \
              "${T_cpu[@]}" || { echo "tpar: failed" >&2; failed+=(tpar); } ;;
    b11)    run b11 --model "$MOE_MODEL" "${roof[@]}" "${T_b11[@]}" --out-dir "$OUT" --suffix "$SUFFIX" "$@" ;;
    profile) echo "+ tests/hal_cuda/gpu_step_profile.py" >&2
             # PROFILE_ONLY="steps ttft ...": those parts of the profile alone;
             # PROFILE_QUANT=fp8 (int8, int4): weights quantized at load, into
             # step_profile_fp8_$SUFFIX; PROFILE_KV=fp8_e4m3: the fp8 KV cache (_kvfp8);
             # PROFILE_TRACES="mixed_32dec_plus_256 ...": the traces of those compositions only
             "$PY" tests/hal_cuda/gpu_step_profile.py \
               "$OUT/step_profile${PROFILE_QUANT:+_$PROFILE_QUANT}${PROFILE_KV:+_kvfp8}_$SUFFIX" \
               $(for x in ${PROFILE_ONLY:-}; do echo "--only=$x"; done) \
               $(for x in ${PROFILE_TRACES:-}; do echo "--trace=$x"; done) \
               --quantization "${PROFILE_QUANT:-none}" --kv-cache-dtype "${PROFILE_KV:-auto}" \
               "${T_cpu[@]}" || { echo "profile: failed" >&2; failed+=(profile); } ;;
    gputests) gpu_pytest gputests tests/hal_cuda/test_models_gpu.py \
                tests/hal_cuda/test_mixed_graphs_gpu.py "${T_gputests[@]}" ;;
    inputs) gpu_pytest inputs tests/hal_cuda/test_conformance_gpu.py \
              -k "copies or pinned or capture_warms or greedy_equals" \
              tests/hal_cuda/test_engine_parity_gpu.py ;;
    multihost) gpu_pytest multihost tests/hal_cuda/test_multihost_gpu.py "${T_multihost[@]}" ;;
    fusion) gpu_pytest fusion tests/hal_cuda/test_fused_gpu.py tests/hal_cuda/test_conformance_gpu.py \
              -k "fused_op or rotary_store_kv or silu_and_mul_linear or test_fused_gpu" "${T_fusion[@]}"
            echo "+ tests/hal_cuda/fused_bench.py" >&2
            "$PY" tests/hal_cuda/fused_bench.py "$OUT/fused_kernels_$SUFFIX.json" "${T_cpu[@]}" ||
              { echo "fusion: the kernel timings failed" >&2; failed+=(fused_bench); }
            # The switch is read by the plugin in each worker process: one engine per setting.
            HAL_CUDA_UNFUSE=all run latency "${common[@]}" "${roof[@]}" "${T_b1[@]}" \
              --out-dir "$OUT" --name "b1_unfused_$SUFFIX" "$@"
            HAL_CUDA_UNFUSE= run latency "${common[@]}" "${roof[@]}" "${T_b1[@]}" \
              --out-dir "$OUT" --name "b1_fused_$SUFFIX" "$@"
            "$PY" benchmarks/fusion_ab.py "$OUT/b1_unfused_$SUFFIX.json" \
              "$OUT/b1_fused_$SUFFIX.json" "$OUT/b1_fusion_$SUFFIX.json" ;;
    # The plugin's conformance suite and kernel tests, compiled (after a kernel change).
    # KERNELS_K="fp8 or decode": those tests alone.
    kernels) gpu_pytest kernels tests/hal_cuda/test_conformance_gpu.py \
               tests/hal_cuda/test_kernels_gpu.py tests/hal_cuda/test_fused_gpu.py \
               ${KERNELS_K:+-k "$KERNELS_K"} "${T_kernels[@]}" ;;
    # Decode attention over bf16 and fp8 caches, each over its tunables, at the 8B heads
    # (gpu_bench.decode_attention_bench), into attention_sweep_$SUFFIX/.
    attnbench) echo "+ tests/hal_cuda/gpu_run.py --only=attention_bench" >&2
               "$PY" tests/hal_cuda/gpu_run.py "$OUT/attention_sweep_$SUFFIX" --only=attention_bench \
                 "${T_cpu[@]}" || { echo "attnbench: failed" >&2; failed+=(attnbench); } ;;
    # Decode attention over contexts of unequal lengths: the batch in a random order or
    # longest first, stage 1's grid heads-first or batch-first (gpu_bench's
    # decode_attention_order_bench), into attention_order_$SUFFIX/.
    attnorder) echo "+ tests/hal_cuda/gpu_run.py --only=attention_order" >&2
               "$PY" tests/hal_cuda/gpu_run.py "$OUT/attention_order_$SUFFIX" --only=attention_order \
                 "${T_cpu[@]}" || { echo "attnorder: failed" >&2; failed+=(attnorder); } ;;
    # Decode attention over the fp8 cache at tiles with a register cap (maxnreg) and
    # without, the bf16 cache's default beside them (gpu_bench's decode_attention_regs_bench),
    # into attention_regs_$SUFFIX/.
    attnregs) echo "+ tests/hal_cuda/gpu_run.py --only=attention_regs" >&2
              "$PY" tests/hal_cuda/gpu_run.py "$OUT/attention_regs_$SUFFIX" --only=attention_regs \
                "${T_cpu[@]}" || { echo "attnregs: failed" >&2; failed+=(attnregs); } ;;
    ncu) ncu_part ;;
    quanttests) gpu_pytest quanttests tests/hal_cuda/test_quant_gpu.py ${QUANT_FILES:-} ${QUANT_K:+-k "$QUANT_K"} \
                  "${T_quanttests[@]}" ;;
    moetests) gpu_pytest moetests tests/hal_cuda/test_kernels_gpu.py tests/hal_cuda/test_models_gpu.py \
                tests/hal_cuda/test_conformance_gpu.py -k "${MOE_K:-moe or mixtral or dots1}" "${T_moetests[@]}" ;;
    # The bf16 one-token GEMV's launch configurations against cuBLAS at the 8B shapes
    # (gpu_bench.gemv_sweep: what gemv.TUNED should hold), into gemv_sweep_$SUFFIX/.
    # Programmatic dependent launch against plain launches: GEMVs alone and chains of decode
    # layers in each HAL_CUDA_PDL mode (tests/hal_cuda/pdl_bench.py), pdl_bench_$SUFFIX.json.
    # One message to a process waiting for it, each way a process can receive it
    # (benchmarks/bench_hop.py: the host's hop, apart from the GPU), hop_$SUFFIX.json.
    hop) echo "+ bench_hop" >&2
         "$PY" -m tessera.benchmarks.bench_hop --out "$OUT/hop_$SUFFIX.json" \
           $([[ $DRY == 1 ]] && echo --messages 50) || { echo "hop: failed" >&2; failed+=(hop); } ;;
    pdlbench) echo "+ tests/hal_cuda/pdl_bench.py" >&2
              "$PY" tests/hal_cuda/pdl_bench.py "$OUT/pdl_bench_$SUFFIX.json" "${T_cpu[@]}" ||
                { echo "pdlbench: failed" >&2; failed+=(pdlbench); } ;;
    gemvsweep) echo "+ tests/hal_cuda/gpu_run.py --only=gemv_sweep" >&2
               "$PY" tests/hal_cuda/gpu_run.py "$OUT/gemv_sweep_$SUFFIX" --only=gemv_sweep \
                 "${T_cpu[@]}" || { echo "gemvsweep: failed" >&2; failed+=(gemvsweep); } ;;
    # The CUDA C GEMV beside variants that each leave one load out (what bounds it).
    nativeprobe) echo "+ tests/hal_cuda/native_gemv_probe.py" >&2
                 "$PY" tests/hal_cuda/native_gemv_probe.py "$OUT/native_gemv_probe_$SUFFIX.json" \
                   "${T_cpu[@]}" ||
                   { echo "nativeprobe: failed" >&2; failed+=(nativeprobe); } ;;
    # int4's one-token GEMV on the tensor cores over an interleaved copy of the weight, beside
    # the plugin's CUDA C GEMV (tests/hal_cuda/int4_mma_probe.py).
    int4mmaprobe) echo "+ tests/hal_cuda/int4_mma_probe.py" >&2
                  "$PY" tests/hal_cuda/int4_mma_probe.py "$OUT/int4_mma_probe_$SUFFIX.json" \
                    "${T_cpu[@]}" ||
                    { echo "int4mmaprobe: failed" >&2; failed+=(int4mmaprobe); } ;;
    # The token GEMM (2-256 tokens, hal/cuda/token_gemm.py) against cuBLAS at the 8B shapes:
    # every candidate timed, the picks in HAL_CUDA_TOKEN_GEMM_TABLE's form (what
    # token_gemm.TUNED should hold), token_gemm_probe_$SUFFIX.json.
    tokengemm) echo "+ tests/hal_cuda/token_gemm_probe.py" >&2
               "$PY" tests/hal_cuda/token_gemm_probe.py "$OUT/token_gemm_probe_$SUFFIX.json" \
                 "${T_cpu[@]}" || { echo "tokengemm: failed" >&2; failed+=(tokengemm); } ;;
    # (with the quantized multi-token tiles, which share its K split and store: wt_tile)
    tokengemmtests) gpu_pytest tokengemmtests tests/hal_cuda/test_token_gemm_gpu.py \
                      tests/hal_cuda/test_quant_gpu.py -k "token_gemm or quant_linear_bf16" \
                      "${T_tokengemmtests[@]}" ;;
    # Decode attention over an fp8 cache in CUDA C beside the Triton stage 1 (nativeattnprobe:
    # its loads alone, two ways, at three tiles), and its tests.
    nativeattn) echo "+ tests/hal_cuda/native_attention_bench.py" >&2
                "$PY" tests/hal_cuda/native_attention_bench.py "$OUT/native_attention_$SUFFIX.json" \
                  "${T_cpu[@]}" || { echo "nativeattn: failed" >&2; failed+=(nativeattn); } ;;
    nativeattnprobe) echo "+ tests/hal_cuda/native_attention_bench.py --probes" >&2
                "$PY" tests/hal_cuda/native_attention_bench.py \
                  "$OUT/native_attention_probes_$SUFFIX.json" --probes "${T_cpu[@]}" ||
                  { echo "nativeattnprobe: failed" >&2; failed+=(nativeattnprobe); } ;;
    nativeattntests) gpu_pytest nativeattntests tests/hal_cuda/test_native_attention_gpu.py \
                       tests/hal_cuda/test_kernels_gpu.py \
                       -k "${NATIVE_K:-native or decode_attention or extend_attention or e4m3}" \
                       "${T_nativeattntests[@]}" ;;
    # Each one-token fusion beside the composition it replaces (what it saves, per scheme).
    fusionprobe) echo "+ tests/hal_cuda/fusion_probe.py" >&2
                 "$PY" tests/hal_cuda/fusion_probe.py "$OUT/fusion_probe_$SUFFIX.json" \
                   "${T_cpu[@]}" ||
                   { echo "fusionprobe: failed" >&2; failed+=(fusionprobe); } ;;
    # Every quantized GEMV candidate at the 8B shapes (which formulation the tuner picks).
    quantbench) echo "+ tests/hal_cuda/gpu_quant_bench.py" >&2
                "$PY" tests/hal_cuda/gpu_quant_bench.py "$OUT/quant_kernels_$SUFFIX.json" \
                  "${T_cpu[@]}" || { echo "quantbench: failed" >&2; failed+=(quantbench); } ;;
    *) ;;
  esac
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run_gpu.sh: failed: ${failed[*]}" >&2
  exit 1
fi
