#!/usr/bin/env bash
# One GPU session's measurements in three device commands (docs/gpu_runbook.md):
#
#   benchmarks/gpu_session.sh 1   # one H200:  gputests, b8, b10, profile          (~410 s)
#   benchmarks/gpu_session.sh 2   # one H200:  b11, b9                             (~400 s)
#   benchmarks/gpu_session.sh 3   # two H200s: tpar, b5check, multihost, b5, b7    (~460 s)
#   benchmarks/gpu_session.sh 4   # one H200:  fusion (fused ops' GPU conformance, B1
#                                 #   with the cuda fusions off, then on)            (~100 s)
#   benchmarks/gpu_session.sh 5   # one H200:  kernels, b2, b3, b8, b12 b1, b11, quantbench
#   benchmarks/gpu_session.sh 6   # one H200:  quantbench, b2 whole chunks, b2, b3, profile
#   benchmarks/gpu_session.sh 7   # one H200:  quanttests, quantbench, b12
#   benchmarks/gpu_session.sh 8   # one H200:  profile fp8, int4, fp8 + fp8 KV; b12 b2 fp8 KV
#   benchmarks/gpu_session.sh 9   # one H200:  moetests, b11 (MOE_K=... narrows the tests)
#   benchmarks/gpu_session.sh 10  # two H200s: b5check, b5 with worker profiles, b7  (~400 s)
#   benchmarks/gpu_session.sh 11  # one H200:  b1, b2, b3 at --overlap-steps 2 and 3  (~350 s)
#   benchmarks/gpu_session.sh 12  # one H200:  b2 at --overlap-steps 2, 3, 2, 3       (~200 s)
#   benchmarks/gpu_session.sh 13  # two H200s: b5, b5 at 3 steps, pp2 at 2 batches, b7 x2 (~450 s)
#   benchmarks/gpu_session.sh 14  # one H200:  inputs (copies' conformance, engine parity), b1, b2 (~170 s)
#   benchmarks/gpu_session.sh 15  # one H200:  b12 b1 at 2 and 3 steps in flight, trace of a c=32 step, b2, b3 (~330 s)
#   benchmarks/gpu_session.sh 16  # one H200:  one-token GEMV tests and sweeps (fp8 / int4, bf16), b12 b1, b1 (~150 s)
#   benchmarks/gpu_session.sh 17  # one H200:  the fp8 / int4 one-token GEMV over a grid of tiles, b12 b1 (~130 s)
#   benchmarks/gpu_session.sh 18  # one H200:  b12 b1 and b2 with the tuner's new lists, b12 b1 at 3 steps (~300 s)
#   benchmarks/gpu_session.sh 19  # one H200:  fp8-cache kernel tests, decode attention sweep, b12 b2 and kv with the fp8 KV cache (~450 s)
#   benchmarks/gpu_session.sh 20  # one H200:  the same after the extend kernel read fp8 words; b12 b2 both caches, fp8 step profile (~480 s)
#   benchmarks/gpu_session.sh 21  # one H200:  attention kernel tests, b2, b12 b2 with the fp8 KV cache, b3 at the swept tunables (~400 s)
#   benchmarks/gpu_session.sh 22  # one H200:  kernel tests and engine parity under programmatic dependent launch, b1, b12 b1 with it and without (~400 s)
#   benchmarks/gpu_session.sh 23  # one H200:  pdlbench (GEMVs and decode-layer chains in each PDL mode), b12 b1 with PDL small and on (~300 s)
#   benchmarks/gpu_session.sh 24  # one H200:  the PDL graph test, engine parity, b1, b2, b3, b12 b1 and b2 at PDL's default (~400 s)
#   benchmarks/gpu_session.sh 25  # one H200:  the PDL graph test again, after its fix (~30 s)
#   benchmarks/gpu_session.sh 26  # one H200:  norm / rotary / PDL tests after the loads' reordering, b1, b12 b1 (~170 s)
#   benchmarks/gpu_session.sh 27  # one H200:  b2, b3, b1 at one commit (~140 s)
#   benchmarks/gpu_session.sh 28  # one H200:  b1, then b1 with every message traced (~90 s)
#   benchmarks/gpu_session.sh 29  # one H200:  extend-attention sweep and worker TTFT, b1, b1 traced, b3 (~250 s)
#   benchmarks/gpu_session.sh 30  # one H200:  extend-attention tests, b1, b2, b3, b1 traced; b2 with whole chunks against b2, twice (~420 s)
#   benchmarks/gpu_session.sh 31  # one H200:  profiler traces of a 512-token prefill and a one-stream decode step (~90 s)
#   benchmarks/gpu_session.sh 32  # one H200:  int4 in word tiles: quant GPU tests, the GEMV / GEMM sweep (words beside halves), b12 b1, b12 int4 b2 (~480 s)
#   benchmarks/gpu_session.sh 33  # one H200:  one-token GEMVs with the next tile's loads ahead (GEMV_PIPE): their GPU tests, the GEMV sweep, b12 b1 (~200 s)
#                                 #   (calls 32 and 33 measured 7b747f3 / 99beac2, both reverted after them)
#   benchmarks/gpu_session.sh 34  # one H200:  the GEMV sweep with int4 at one scale a row (what the groups cost), b12 b1 (~150 s)
#   benchmarks/gpu_session.sh 35  # one H200:  one-token GEMVs software-pipelined (GEMV_STAGES2 / 3): their GPU tests, the GEMV sweep, b12 b1 (~200 s)
#                                 #   (call 36, at 6bdeb60: the GEMVs' first weight tile loaded before their PDL
#                                 #   wait, HAL_CUDA_PDL=preload; no faster, reverted: its case is in that commit)
#   benchmarks/gpu_session.sh 37  # one H200:  inputs tests, the host's hop each way, b1 with the loop waiting on its sockets and without, b1 traced, b3 (~330 s)
#   benchmarks/gpu_session.sh 38  # one H200:  the host's hop each way, b1 with busy polling and without (twice), b1 traced, b3, b2 (~400 s)
#   benchmarks/gpu_session.sh 39  # one H200:  the hop benchmark again, b1 three times polling and once not, b12 b1 (~250 s)
#   benchmarks/gpu_session.sh 40  # one H200:  b3 with larger mixed steps (--max-mixed-step-ratio 2.4, 3.0) (~130 s)
#   benchmarks/gpu_session.sh 41  # one H200:  the CUDA C one-token GEMV (native_gemv): its GPU tests, the GEMV sweep, b12 b1 (~300 s)
#   benchmarks/gpu_session.sh 42  # one H200:  what bounds it: the native GEMV probe, the batch-1 sweep with int4 at one scale a row (~150 s)
#   benchmarks/gpu_session.sh 43  # one H200:  b12 b1 with the native GEMVs' first loads before their PDL wait and without, twice (~260 s)
#   benchmarks/gpu_session.sh 44  # one H200:  the one-token fusion (norms, residual adds, SiLU in the native GEMV): its GPU tests, b12 b1 with it, without, with (~420 s)
#   benchmarks/gpu_session.sh 45  # one H200:  the fusions' probe (each against its composition), their GPU tests, b12 b1 auto / all / auto (~450 s)
#   benchmarks/gpu_session.sh 46  # one H200:  the rotary / KV store epilogue too: the probe, the GPU tests, b12 b1 with the fusion, without, with 3 steps in flight (~480 s)
#   benchmarks/gpu_session.sh 47  # one H200:  the fusion's GPU tests call 46 did not reach in its limit, b12 b1 with int4 left plain by default (~220 s)
#   benchmarks/gpu_session.sh 48  # one H200:  decode attention over unequal contexts (order, grid), b2 and b3 with the decodes longest first and as before (~480 s)
#   benchmarks/gpu_session.sh 49  # one H200:  the order bench over more batches and split counts, b2 and b3 as before and with the order (reversed), b1 (~400 s)
#   benchmarks/gpu_session.sh 50  # one H200:  the order bench and b2, b3, b2, b1 with two splits up to 82 decodes (~260 s)
#   benchmarks/gpu_session.sh 51  # one H200:  the order bench with the fp8 cache (keys as the dot's first operand or second), b12 b2 with both caches (~330 s)
#   benchmarks/gpu_session.sh 52  # one H200:  b3 with the decodes longest first and as before, a third pair (~150 s)
#   benchmarks/gpu_session.sh 53  # one H200:  decode attention's first key tile before its PDL wait, and its register prefetch: the kernel tests, the prefetch bench, b1 with EARLY_KV / without / with, b12 fp8 B2 over the fp8 cache with the prefetch and without (~450 s)
#   benchmarks/gpu_session.sh 54  # one H200:  decode attention over the fp8 cache with the keys' words in the dot's order: the kernel tests, the permute bench, b12 fp8 B2 over the fp8 cache with it / without / with, b2, b3 (~450 s)
#   benchmarks/gpu_session.sh 55  # one H200:  Nsight Compute over decode attention (bf16 / fp8 cache) and the projections (bf16, fp8, int4) (~120 s)
#   benchmarks/gpu_session.sh 56  # one H200:  the W8A8 tiles with more programs (64 x 64, K split, K steps of 256): their GPU tests, every fp8 candidate at 64-256 tokens beside bf16, b12 B2 bf16 / fp8, fp8 over the fp8 cache (~170 s; at 175e3df, whose 256-token W8A8 tiles 5f18619 dropped)
#   benchmarks/gpu_session.sh 57  # one H200:  decode attention over the fp8 cache under a register cap (maxnreg): the kernel tests, the tile bench, b12 fp8 B2 over the fp8 cache at its fastest tile / the default / the fastest (~330 s)
#   benchmarks/gpu_session.sh 58  # one H200:  the keys in an e4m3 dot (FP8_QDOT): the kernel tests, the tile bench, b12 fp8 B2 over the fp8 cache with it / without / with, the fp8 cache's KL with it and without (~420 s)
#   benchmarks/gpu_session.sh 59  # one H200:  fp8 activations quantized in the norm's / SiLU's kernel (rows_fused) and the fp8 cache's small-batch tile: their GPU tests, b12 B2 bf16 / fp8, fp8 without the fusion, fp8 over the fp8 cache, fp8 again (~330 s)
#   benchmarks/gpu_session.sh 60  # one H200:  rows_fused's GPU tests again, the fp8 step profile with the fusion and without, b12 fp8 B2 without it / with it (~400 s)
#   benchmarks/gpu_session.sh 61  # one H200:  the fp8 step profile's steps without rows_fused's fusion, then with it (the other order), b12 fp8 B2 with it / without (~220 s)
#   benchmarks/gpu_session.sh 62  # one H200:  issue 13's figures: b1, b2, b2 without the gc freeze, b2 traced step by step without it, b3 (~380 s)
#   benchmarks/gpu_session.sh 63  # one H200:  issue 17's figures: b12 b1 (bf16 / fp8 / int4), b12 B2 bf16 / fp8, fp8 over the fp8 cache (~330 s)
#   benchmarks/gpu_session.sh 64  # one H200:  b2 with the worker profiled over decode steps at 256 requests and in the drain: device busy against wall (~70 s)
#   benchmarks/gpu_session.sh 65  # one H200:  a decode graph's logits kept in bf16 for greedy steps: the sample tests, engine parity, b2 twice, b3, b12 B2 bf16 / fp8 (~330 s)
#   benchmarks/gpu_session.sh 67  # one H200:  the LM head quantized too (--quantize-lm-head): b12 kl and b1 of bf16 / fp8 / fp8+head / int4 / int4+head, b12 B2 bf16 / fp8 / fp8+head (~400 s)
#   benchmarks/gpu_session.sh 68  # one H200:  issue 13's figures at the session's commit: b1, b2 twice, b3 (~200 s)
#   benchmarks/gpu_session.sh 69  # one H200:  W8A8 tiles accumulating in place (A8F): every tuner candidate's test, b12 B2 bf16 / fp8, fp8 without A8F, fp8 again, fp8 over the fp8 cache (~300 s)
#   benchmarks/gpu_session.sh 70  # one H200:  A8F at 17-32 tokens: every tuner candidate's test, B3 c=32 over fp8 weights with A8F and without, twice (~250 s)
#   benchmarks/gpu_session.sh 71  # one H200:  the prefill backlog rule: b2, b3 with it and without (--prefill-backlog-steps 0), twice (~300 s)
#   benchmarks/gpu_session.sh 72  # one H200:  B3's c=128 tier traced step by step with its prefill steps filled into their padding (the default), without, and with the backlog rule, beside the simulator's cost of each step (~300 s)
#   benchmarks/gpu_session.sh 73  # one H200:  prefill steps filled into their padding: b3 with --fill-padded-steps and without (then the default), twice, then b2 (~430 s; ran at 89cb004 on an H100)
#   benchmarks/gpu_session.sh 74  # one H200:  call 75's comparison at c=128 alone, twice, no b2 (~220 s)
#   benchmarks/gpu_session.sh 75  # one H200:  issue 13's figures with the padding filled (the default since 73) and without (--no-fill-padded-steps): b3 alternating, twice, b2, b1 (~370 s)
#   benchmarks/gpu_session.sh 76  # one H200:  issue 17's figures (b12 b1 bf16 / fp8 / int4, b12 B2 bf16 / fp8), then B3's c=128 tier traced step by step filled and not (~330 s)
#   benchmarks/gpu_session.sh 77  # one H200:  issue 13's figures at the session's commit: b2, b3, b2 (~190 s)
#   benchmarks/gpu_session.sh 78  # one H200:  the token GEMM (2-256 tokens): its GPU tests, the probe against cuBLAS, b2 with the probe's picks / cuBLAS, b3 with them / cuBLAS (~450 s)
#   benchmarks/gpu_session.sh 80  # one H200:  B1 with the worker profiled over 16 decode steps, bf16 / fp8 / int4 weights (profile_summary of each), then b12 b1 (~330 s)
#   benchmarks/gpu_session.sh 81  # one H200:  the streamed native GEMV: native GPU tests, the batch-1 GEMV sweep, b12 b1, B1 profiled over int4 / fp8 (~480 s)
#   benchmarks/gpu_session.sh 82  # one H200:  call 81 on a short budget: the GEMV sweep first, then the native tests, b12 b1 (~270 s)
#                                 #   (call 81 measured the streamed GEMV at 6ad132e, slower than the plain native
#                                 #   kernel on every shape; removed after it)
#   benchmarks/gpu_session.sh 83  # one H200:  decode attention's first tile before its PDL wait (HAL_CUDA_DECODE_PRELOAD at b21705a, reverted after): PDL chain tests, b12 b1 alternated twice with / without, B1 fp8 profiled (~500 s)
#   benchmarks/gpu_session.sh 84  # one H200:  after the removals: native GEMV GPU tests, the PDL decode chain, b12 b1 (~200 s)
#   benchmarks/gpu_session.sh 85  # an H200 only: the token GEMM's probe on this card, b2 with its picks / cuBLAS alone alternated twice, b3 with / without (~520 s)
#   benchmarks/gpu_session.sh 86  # any card: the fp8 cache's decode attention in CUDA C: its GPU tests, its bench beside Triton, b12 b2 over the fp8 cache with it / without, over a bf16 cache (~420 s)
#   benchmarks/gpu_session.sh 87  # any card: the same through cp.async rings: its tests, the bench over tiles, b12 b2 over the fp8 cache with it / without, twice (~330 s)
#   benchmarks/gpu_session.sh 88  # any card: call 87 in less time: the tests, the bench, b12 fp8 b2 over the fp8 cache with it / without, twice (~250 s)
#   benchmarks/gpu_session.sh 89  # any card: the native stage 1 with fewer instructions a tile: its tests, the bench (with its loads alone), b12 fp8 b2 over the fp8 cache at the best tile with it / without, twice (~250 s)
#   benchmarks/gpu_session.sh 90  # any card: the native stage 1's loads alone three ways (half-line K, whole-line K, a block over a request's KV heads) beside Triton and the whole kernel, and the whole kernel over a request's heads, with its GPU test (~110 s)
#   benchmarks/gpu_session.sh 91  # any card: int4's one-token GEMV on the tensor cores over 8-row-interleaved halves128 tiles, beside the CUDA C GEMV and its loads alone, on the 8B linears; its GPU tests, b12 int4 b1 with it / without, twice (~320 s)
#
# Each part is a benchmarks/run_gpu.sh part run under its own time limit (its cap, or what is
# left of the call's budget BUDGET_S, default 450 s, if less): a part that hangs or crashes
# costs its cap, never the call, and the parts after it still run. After each part the GPU
# processes left behind are killed by pid and the results so far are packed into $OUT, so what
# was measured comes back even if the device command itself is cut off:
#   $OUT/call<N>.log            everything printed
#   $OUT/call<N>_summary.txt    one line a part: exit code, seconds, expected, limit
#   $OUT/call<N>_results.tgz    the parts' JSON, PNG and logs (benchmarks/results layout)
#   $OUT/call<N>_traces.tgz     the step profile's chrome traces (call 1), kept apart for size
# Unpack call<N>_results.tgz into benchmarks/results/ to commit what is worth keeping.
#
# The calls' result names say h200 (the reference card). On another card (the device tool
# may lend an H100 for an H200) every name the parts are given says that card instead
# (h100), run_gpu.sh's own names too (SUFFIX), and the roofline bounds are measured in the
# run (MEASURE=1) in place of the H200's figures.
#
# On the GPU machine: wheels from .whl/ are installed to /tmp/site (pyzmq, gguf, xgrammar and
# its pydantic/tvm-ffi, prometheus-client, sglang-router; ../shared/gpu/prepare.sh and the
# runbook list them), PYTHONPATH is exported for every child, NVLink multicast stays off, and
# TESSERA_COMMIT (set it to the commit measured: the device copy's git metadata is stale) is
# written into every result.
#
# DRY=1 rehearses a call on a machine without a GPU: the same parts, in the same order, with
# run_gpu.sh's tiny dry-run workloads on the cpu plugin and the GPU machine's packages alone
# (scripts/gpu_env). Nothing is installed; the GPU count is not checked.
#
# EXTRA_PARTS="b3 ..." appends run_gpu.sh parts to the call (each capped at 200 s) for
# whatever budget is left.
set -uo pipefail
cd "$(dirname "$0")/.."
CALL=${1:-}
DRY=${DRY:-0}
# Three calls of a machine start (~1.5 min), the wheels' install and this budget fit the
# session's 30 minutes of device time.
BUDGET_S=${BUDGET_S:-450}
MIN_PART_S=30  # a part with less time than this left is skipped, not started
OUT=${OUT:-${TMPDIR:-/tmp}/tessera-gpu-session}
CARD=h200  # the card the results are named for (below: the one found)
[[ $CALL =~ ^([1-9]|1[0-9]|2[0-9]|3[0-5789]|4[0-9]|5[0-9]|(6[0-5789]|7[0-8]|8[0-9]|9[01]))$ ]] || { echo "usage: $0 1|...|35, 37-65, 67-78, 80-91  (see the header)" >&2; exit 2; }
mkdir -p "$OUT"
RES=$(mktemp -d "${TMPDIR:-/tmp}/tessera-gpu-results.XXXXXX")
LOG=$OUT/call$CALL.log
SUMMARY=$OUT/call${CALL}_summary.txt
: >"$LOG"
: >"$SUMMARY"
say() { echo "[session] $*" | tee -a "$LOG" >&2; }

export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DRY
PY=${PYTHON:-python3}
export PYTHON=$PY
if [[ $DRY != 1 ]]; then
  if [[ -d .whl ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl 2>&1 | tee -a "$LOG"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    say "no .whl/ here: pyzmq, gguf, xgrammar, sglang-router must already be installed"
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tee -a "$LOG"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG" || echo 0)
  need=$([[ $CALL == 3 || $CALL == 10 || $CALL == 13 ]] && echo 2 || echo 1)
  say "GPUs: $gpus (call $CALL needs $need); commit ${TESSERA_COMMIT:-unset}"
  if (( gpus < need )); then
    say "too few GPUs for call $CALL: nothing run (call 3 is for nvidia-h200-x2)"
    echo "call $CALL: not run, $gpus GPU(s)" >>"$SUMMARY"
    exit 3
  fi
  card=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))' 2>>"$LOG" || echo unknown)
  case $card in
    *H200*) ;;
    *H100*) CARD=h100 ;;
    *) CARD=$(echo "$card" | tr -cs 'A-Za-z0-9' '_' | tr 'A-Z' 'a-z' | sed 's/^_*//; s/_*$//') ;;
  esac
  if [[ $CARD != h200 ]]; then
    export SUFFIX=$CARD MEASURE=1
    say "the card is $card, not an H200: results named _$CARD, roofline bounds measured"
  fi
  [[ -n ${TESSERA_COMMIT:-} ]] || say "TESSERA_COMMIT is unset: results will name the device copy's stale commit"
  "$PY" -c 'import zmq, gguf, xgrammar, prometheus_client' 2>&1 | tee -a "$LOG" ||
    say "a carried wheel does not import (above): the parts that need it will fail"
fi

pack() {
  (cd "$RES" && tar czf "$OUT/call${CALL}_results.tgz" --exclude='trace_*' .) 2>>"$LOG"
  local traces
  traces=$(cd "$RES" && find . -name 'trace_*' | sort)
  if [[ -n $traces ]]; then
    # shellcheck disable=SC2086
    (cd "$RES" && tar czf "$OUT/call${CALL}_traces.tgz" $traces) 2>>"$LOG"
  fi
}

# GPU processes a part left behind (a server in a session of its own, when its parent was
# killed at the limit) would hold memory the next part needs: ended by pid.
reap() {
  [[ $DRY == 1 ]] && return 0
  command -v nvidia-smi >/dev/null || return 0
  local pids
  pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
  for pid in $pids; do
    [[ $pid =~ ^[0-9]+$ ]] || continue
    say "killing leftover GPU process $pid: $(ps -o args= -p "$pid" 2>/dev/null | cut -c1-120)"
    kill -9 "$pid" 2>/dev/null || true
  done
}

# traced_c128 NAME:FLAGS CALL: B3's c=128 tier with FLAGS, every message traced, then
# summarized step by step (step_trace --cost-model tokens) beside the simulator's costs.
traced_c128() {
  local name=${1%%:*} flags=${1#*:} call=$2
  part "b3c128$name" 90 60 b3 --concurrency 128 --server-args \
    "$flags --trace-messages-dir $RES/trace_b3_$name" \
    --name "b3_c128_${name}_traced_${call}_$CARD"
  # (its whole output to a file first: `| head` would end it by SIGPIPE before --out)
  local steps="$RES/b3_c128_${name}_steps_${call}_$CARD"
  timeout 120 "$PYTHON" -m tessera.benchmarks.step_trace "$RES/trace_b3_$name" \
    --cost-model tokens --out "$steps.json" >"$steps.txt" 2>&1
  head -8 "$steps.txt" | tee -a "$LOG"
}

start=$SECONDS
# part NAME CAP_S EXPECTED_S ARGS...: `run_gpu.sh ARGS` (results into $RES) under
# min(CAP_S, budget left) seconds.
# The native stage 1's tile that was fastest over B2's spreads in this run's bench (4,3 where
# the bench left no answer).
native_tile() {
  "$PY" - "$RES/native_attention_$CARD.json" <<'PICK' 2>/dev/null || echo 4,3
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
names = [n for n in cases if n.startswith("b2_")]
keys = [k for k in cases[names[0]] if k.startswith("native_w") and "splits" not in k
        and "loads_only" not in k]
ok = [k for k in keys if all("us" in cases[n].get(k, {}) for n in names)]
best = min(ok, key=lambda k: sum(cases[n][k]["us"] for n in names))
print(best.replace("native_w", "").replace("_s", ","))
PICK
}

# Calls 87 and 89's start: the native tests, the bench (expected $1 s), then `tile`, the
# bench's fastest over B2's spreads.
native_prologue() {
  NATIVE_K=native part nativeattntests 150 40 nativeattntests
  part nativeattn 200 "$1" nativeattn
  tile=$(native_tile)
  say "native tile for B12: $tile"
  echo "native tile $tile" >>"$SUMMARY"
}

part() {
  local name=$1 cap=$2 expect=$3
  shift 3
  local left=$((BUDGET_S - (SECONDS - start)))
  local limit=$((cap < left ? cap : left))
  if ((limit < MIN_PART_S)); then
    say "$name: skipped, ${left}s of the budget left"
    echo "$name skipped (budget: ${left}s left, expected ${expect}s)" >>"$SUMMARY"
    return
  fi
  [[ $CARD == h200 ]] || set -- "${@//_h200/_$CARD}"
  say "$name: start (expected ~${expect}s, limit ${limit}s): run_gpu.sh $*"
  local t0=$SECONDS
  timeout -k 15 "$limit" env OUT="$RES" bash benchmarks/run_gpu.sh "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  local what="rc=$rc"
  ((rc == 124 || rc == 137)) && what="TIMED OUT (rc=$rc)"
  say "$name: $what after ${took}s"
  echo "$name $what ${took}s (expected ${expect}s, limit ${limit}s)" >>"$SUMMARY"
  reap
  pack
}

# B1 with the worker profiled over 16 decode steps inside the fourth request (B1: 129 steps
# a request), weights of scheme $1 (bf16: none), summarized by profile_summary (device busy
# against the window's wall, time by kernel kind, the top kernels); $2 names the files.
b1_profiled() {
  local scheme=$1 tag=$2 q=()
  [[ $scheme == bf16 ]] || q=(--quantization "$scheme")
  part "b1prof_$scheme" 110 60 b1 "${q[@]}" --profile-dir "$RES/b1_profile_$scheme" \
    --profile-steps "${PROFILE_STEPS:-420:16}" --name "b1_${scheme}_profiled_${tag}_h200"
  if [[ -d $RES/b1_profile_$scheme ]]; then
    "$PY" -m tessera.benchmarks.profile_summary "$RES/b1_profile_$scheme" \
      --out "$RES/b1_profile_summary_${scheme}_${tag}_$CARD.json" >/dev/null 2>>"$LOG" ||
      say "profile summary failed ($scheme)"
    gzip -f "$RES/b1_profile_$scheme"/*.trace.json 2>/dev/null || true
  fi
}

# The step profile's parts that the serving issue needs (the kernel sweeps take minutes).
export PROFILE_ONLY=${PROFILE_ONLY:-steps ttft traces}
case $CALL in
  1)
    part gputests 240 150 gputests
    part b8 180 70 b8
    part b10 200 100 b10
    part profile 200 90 profile
    ;;
  2)
    part b11 300 200 b11
    part b9 300 200 b9
    ;;
  3)
    part tpar 90 40 tpar
    part b5check 150 60 b5check
    part multihost 200 100 multihost
    part b5 280 145 b5 --layout-timeout-s 100
    part b7 200 115 b7
    ;;
  4)
    part fusion 200 100 fusion
    ;;
  5)
    # After a kernel change: the compiled kernels' tests first, then the serving figures
    # (B2 and B3 in one run for B3's c=128 ratio), B8, and the quantized batch-1 path.
    part kernels 240 150 kernels
    part b2 90 35 b2
    part b3 120 60 b3
    part b8 120 75 b8
    part b12b1 120 70 b12 --parts b1 --name b12_b1_h200
    part b11 150 100 b11
    part quantbench 120 90 quantbench
    ;;
  6)
    # Diagnosis: the quantized GEMV's per-candidate sweep; B2 with whole prefill chunks (its
    # slow launches name the kernels that compiled) beside the default B2 and B3 (c=128's
    # ratio in one run); the step profile's B2-shaped steps (decode at 256, a whole chunk
    # beside 128 decodes) with their kernel tables.
    part quantbench 130 90 quantbench
    part b2ratio0 100 45 b2 --max-mixed-step-ratio 0 --name b2_ratio0_h200
    part b2 90 35 b2
    part b3 120 60 b3
    PROFILE_ONLY="steps traces" part profile 150 100 profile
    ;;
  7)
    # After a quantized-kernel change: their GPU tests (every tuner candidate against the
    # definition), the sweep (batch-1 GEMV candidates, several-token candidates of gate_up
    # and down, the linears at batch 1-256), then the whole of B12 (bf16 beside fp8 and int4:
    # KL, B1, B2, the fp8 KV cache). BUDGET_S=540 fits all three. QUANT_K="int4" narrows the
    # tests (pytest -k); B12_ARGS="--schemes int4 --parts b2" narrows B12 (then named
    # b12_part_h200, beside the whole run's b12_h200).
    part quanttests 150 80 quanttests
    part quantbench 200 120 quantbench
    if [[ -n ${B12_ARGS:-} ]]; then
      # shellcheck disable=SC2086
      part b12 230 170 b12 $B12_ARGS --name b12_part_h200
    else
      part b12 230 170 b12
    fi
    ;;
  8)
    # Where a quantized step's time goes: the step profile's decode steps (1, 32 and 256
    # requests) and their kernel tables with fp8 and with int4 weights, then with fp8 weights
    # and the fp8 KV cache (with the decode attention's tunables swept on e4m3 caches); B2
    # with fp8 weights and the fp8 KV cache beside bf16 weights with it.
    PROFILE_ONLY="steps traces" PROFILE_QUANT=fp8 part profile_fp8 150 100 profile
    PROFILE_ONLY="steps traces" PROFILE_QUANT=int4 part profile_int4 150 100 profile
    PROFILE_ONLY="steps sweep_decode traces" PROFILE_QUANT=fp8 PROFILE_KV=fp8_e4m3 \
      part profile_fp8kv 200 130 profile
    part b12kvfp8 150 90 b12 --schemes bf16,fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_h200
    ;;
  9)
    # After a MoE change: the MoE kernels' and models' GPU tests, then B11. MOE_K narrows the
    # tests' -k ("(moe and not qwen2_moe and not dots1) or mixtral": Mixtral and Qwen3-MoE
    # only, as 52a5e70's run did in its 139 s).
    part moetests 200 90 moetests
    part b11 200 125 b11
    ;;
  10)
    # Two H200s, where TP=2 and PP=2 time goes: the two-GPU checks (NCCL, the one-shot
    # all-reduce, the pipeline's queued transfers, TP=2 and PP=2 parity), then B5 with every
    # worker profiled over decode steps of B1's second warm-up request and over B2's middle
    # (PROFILE_STEPS), summarized into b5_profile_summary_h200.json (the raw traces go to
    # call10_traces.tgz), then B7. The profiles stall B2 while they are written: this B5 is
    # named b5_h200_profiled, a diagnosis beside the clean run (call 3's b5).
    part b5check 150 70 b5check
    part b5 300 170 b5 --layout-timeout-s 110 --suffix h200_profiled \
      --profile-dir "$RES/profile" --profile-steps "${PROFILE_STEPS:-150:20,1500:10}"
    if [[ -d $RES/profile ]]; then
      "$PY" -m tessera.benchmarks.profile_summary "$RES/profile" \
        --out "$RES/b5_profile_summary_h200.json" >/dev/null 2>>"$LOG" ||
        say "profile summary failed"
      for f in "$RES"/profile/*/*.trace.json; do
        [[ -e $f ]] || continue
        layout=$(basename "$(dirname "$f")")
        mv "$f" "$RES/trace_${layout}_$(basename "$f")"
      done
    fi
    part b7 200 115 b7
    ;;
  11)
    # One H200, the scheduler's steps in flight (--overlap-steps): B1, B2 and B3 at 2 (the
    # default) and at 3, each pair back to back.
    part b1 90 35 b1
    part b1d3 90 35 b1 --overlap-steps 3 --name b1_overlap3_h200
    part b2 90 35 b2
    part b2d3 90 35 b2 --overlap-steps 3 --name b2_overlap3_h200
    part b3 120 60 b3
    part b3d3 120 60 b3 --server-args "--overlap-steps 3" --name b3_overlap3_h200
    ;;
  12)
    # One H200: B2 alternately at --overlap-steps 2 and 3, twice (run-to-run spread beside
    # the difference).
    for i in 1 2; do
      part "b2d2_$i" 80 32 b2 --name "b2_overlap2_run${i}_h200"
      part "b2d3_$i" 80 32 b2 --overlap-steps 3 --name "b2_overlap3_run${i}_h200"
    done
    ;;
  13)
    # Two H200s after c62ab61's profiles, most wanted first: B5 clean (an 8B rank's TP=2
    # shapes on the GEMV, the pipeline's queued transfers, a step's inputs in one copy); B7
    # as it is, then with the router's balance thresholds low enough to even out the 9 and 7
    # prefix groups the replicas got in both runs so far; TP=1 and TP=2 again with three
    # steps in flight; PP=2 with two batches in flight (a stage's weights read twice a
    # round, not three times).
    part b5 280 150 b5 --layout-timeout-s 100
    part b7 120 45 b7
    part b7bal 120 45 b7 --name b7_balanced_h200 \
      --dp-args "--router-balance-abs-threshold 8 --router-balance-rel-threshold 1.1"
    part b5d3 200 100 b5 --layout-timeout-s 90 --layouts tp1,tp2 --overlap-steps 3 \
      --suffix h200_overlap3
    part b5ppb2 150 90 b5 --layout-timeout-s 70 --layouts tp1,pp2 --pp-batches-in-flight 2 \
      --suffix h200_ppb2
    ;;
  14)
    # One H200 after a change to how a step's inputs reach the device: the copies'
    # conformance and the whole engine's greedy parity with transformers, then B1 and B2.
    part inputs 150 80 inputs
    part b1 90 35 b1
    part b2 90 35 b2
    ;;
  15)
    # One H200 after the host path's change (small arrays in one frame, the next step sent
    # before the last one's tokens, the workers' launch and round-trip counters): B12's batch-1
    # part (bf16, fp8 and int4 weights; fp8's 3.5 ms step against its 3.0 ms of device time
    # said the host round trip was in its path) at 2 steps in flight, then at 3; then the
    # traces of one B3 c=32 step (32 decodes and a 256-token chunk) for its picture; then B2
    # and B3 (c=128's ratio to B2 in one run) with the new host path, while budget lasts.
    part b12b1 130 75 b12 --parts b1 --name b12_b1_h200
    PROFILE_ONLY=traces PROFILE_TRACES=mixed_32dec_plus_256 part tracec32 120 60 profile
    part b12b1d3 130 75 b12 --parts b1 --overlap-steps 3 --name b12_b1_overlap3_h200
    part b2 90 35 b2
    part b3 120 60 b3
    ;;
  16)
    # One H200 after the one-token GEMVs' 2-D accumulator (GEMV_ACC, the bf16 GEMV's ACC):
    # the tuner candidates of fp8 and int4 against the definition at batch 1, the batch-1
    # sweep of every fp8 / int4 GEMV candidate (no several-token sweep) and of the bf16
    # GEMV's configurations, then B12's batch-1 part (the tuner picking among the listed
    # candidates) and B1.
    QUANT_K="every_tuner_candidate and (fp8-1] or int4-1])" part quanttests 120 50 quanttests
    QUANT_GEMM_SWEEP=0 part quantbench 150 80 quantbench
    part gemvsweep 90 40 gemvsweep
    part b12b1 130 75 b12 --parts b1 --name b12_b1_h200
    part b1 90 35 b1
    ;;
  17)
    # One H200: the batch-1 fp8 and int4 GEMV over a grid of tiles and formulations beyond
    # the tuner's lists (QUANT_GEMV_WIDE=1; which tiles the lists should hold), then B12's
    # batch-1 part again.
    QUANT_GEMM_SWEEP=0 QUANT_GEMV_WIDE=1 part quantwide 260 200 quantbench
    part b12b1 130 75 b12 --parts b1 --name b12_b1_h200
    ;;
  18)
    # One H200 after the GEMV lists took the grid's fastest tiles (call 17): their GPU tests
    # at batch 1, B12's batch-1 part at 2 steps in flight, its B2 part (fp8's ratio to bf16),
    # and its batch-1 part at 3 steps in flight.
    QUANT_K="every_tuner_candidate and (fp8-1] or int4-1])" part quanttests 120 30 quanttests
    part b12b1 130 70 b12 --parts b1 --name b12_b1_h200
    part b12b2 150 90 b12 --parts b2 --name b12_b2_h200
    part b12b1d3 130 70 b12 --parts b1 --overlap-steps 3 --name b12_b1_overlap3_h200
    ;;
  19)
    # One H200 after decode attention read an fp8 cache as words of two elements (the
    # hardware's e4m3x2 conversion, float16 dots): the fp8-cache and decode kernel tests and
    # the conformance suite's fp8 KV cases, compiled; the decode-attention sweep (bf16, fp8 as
    # words, fp8 element by element as before); B12's B2 with the fp8 KV cache (bf16 and fp8
    # weights) and its kv part (the same KV bytes: a bf16 pool that retracts against twice the
    # tokens in fp8).
    KERNELS_K="fp8 or e4m3 or decode" part kernels 150 80 kernels
    part attnbench 150 90 attnbench
    part b12kvfp8 170 110 b12 --schemes bf16,fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_h200
    part b12kv 170 110 b12 --schemes bf16 --parts kv --name b12_kv_h200
    ;;
  20)
    # One H200 after the extend kernel read an fp8 cache as words too (and an fp32 q kept
    # fp32 dots over them): the kernel tests again, the decode-attention sweep with split
    # counts, B12's B2 over a bf16 cache and over the fp8 one (bf16 and fp8 weights each, one
    # run), then the step profile with fp8 weights and the fp8 cache.
    KERNELS_K="fp8 or e4m3 or decode or extend" part kernels 150 80 kernels
    part attnbench 150 90 attnbench
    part b12b2 150 75 b12 --schemes bf16,fp8 --parts b2 --name b12_b2_h200
    part b12kvfp8 150 75 b12 --schemes bf16,fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_h200
    PROFILE_ONLY=steps PROFILE_QUANT=fp8 PROFILE_KV=fp8_e4m3 part profile 150 90 profile
    ;;
  21)
    # One H200 after decode attention took the sweep's tunables (bf16 three stages, fp8
    # words two warps and three stages): the attention and fp8 tests (call 20's timed out
    # with the graph tests that "decode" selected), B2, B12's B2 over the fp8 cache (bf16
    # and fp8 weights), B3.
    KERNELS_K="fp8 or e4m3 or attention" part kernels 200 120 kernels
    part b2 90 40 b2
    part b12kvfp8 150 70 b12 --schemes bf16,fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_h200
    part b3 130 70 b3
    ;;
  22)
    KERNELS_K="pdl or rms or rotary or silu or linear or gemv or attention_decode or sample or argmax or greedy or replay" \
      part kernels 200 130 kernels
    QUANT_K="every_tuner_candidate and (fp8-1] or int4-1])" part quanttests 90 30 quanttests
    part inputs 150 80 inputs
    part b1 90 35 b1
    part b12b1 130 70 b12 --parts b1 --name b12_b1_h200
    HAL_CUDA_PDL=0 part b12b1nopdl 130 70 b12 --parts b1 --name b12_b1_nopdl_h200
    ;;
  23)
    part pdlbench 200 90 pdlbench
    HAL_CUDA_PDL=small part b12b1small 130 70 b12 --parts b1 --name b12_b1_pdlsmall_h200
    HAL_CUDA_PDL=1 part b12b1pdl 130 70 b12 --parts b1 --name b12_b1_pdl_h200
    ;;
  24)
    KERNELS_K="pdl" part kernels 120 40 kernels
    part inputs 150 60 inputs
    part b1 90 35 b1
    part b2 90 40 b2
    part b3 130 70 b3
    part b12b1 130 70 b12 --parts b1 --name b12_b1_h200
    part b12b2 150 90 b12 --parts b2 --name b12_b2_h200
    ;;
  25)
    KERNELS_K="pdl or graph_replay" part kernels 120 40 kernels
    ;;
  26)
    KERNELS_K="pdl or rms or rotary or norm or replay" part kernels 150 60 kernels
    part b1 90 35 b1
    part b12b1 130 70 b12 --parts b1 --name b12_b1_h200
    ;;
  27)
    part b2 60 35 b2
    part b3 90 65 b3
    part b1 50 30 b1 --name b1_call62_h200
    ;;
  28)
    # B1, then B1 again with --trace-messages-dir: where its time to first token goes, hop
    # by hop (the medians in b1_traced_h200.json, every line under b1_trace_h200/).
    part b1 50 30 b1 --name b1_call62_h200
    part b1traced 60 35 b1 --iters 10 --trace-messages-dir "$RES/b1_trace_h200" \
      --name b1_traced_h200
    ;;
  29)
    # After a first token leaves the scheduler ahead of the next batch: the extend-attention
    # tile sweep (prefill and mixed shapes) and the worker's own TTFT, B1, B1 traced, B3.
    PROFILE_ONLY="sweep_extend ttft" part profile 120 60 profile
    part b1 50 30 b1 --name b1_call62_h200
    part b1traced 60 35 b1 --iters 10 --trace-messages-dir "$RES/b1_trace_h200" \
      --name b1_traced_h200
    part b3 100 65 b3
    ;;
  30)
    # Extend attention in three stages: its GPU tests, then B1, B2, B3 at one commit and B1
    # traced; then B2 with whole prefill chunks (no decode protection: --max-mixed-step-ratio
    # 0) against B2 as it is, alternating, twice each.
    KERNELS_K="extend" part kernels 120 50 kernels
    part b1 50 30 b1 --name b1_call62_h200
    part b2 70 45 b2
    part b3 100 65 b3
    part b1traced 60 35 b1 --iters 10 --trace-messages-dir "$RES/b1_trace_h200" \
      --name b1_traced_h200
    part b2ratio0 70 45 b2 --max-mixed-step-ratio 0 --name b2_ratio0_run1_h200
    part b2again 70 45 b2 --name b2_run2_h200
    part b2ratio0again 70 45 b2 --max-mixed-step-ratio 0 --name b2_ratio0_run2_h200
    ;;
  31)
    # Where a prefill step's launch goes on the host (B1's TTFT): the profiler's traces of a
    # 512-token prefill and of a one-stream decode step, graphs and eager.
    PROFILE_ONLY=traces PROFILE_TRACES="prefill_only_512 decode_bs1" part profile 150 70 profile
    ;;
  32)
    # One H200 after int4 moved to word tiles (qgemv_words_kernel: a LOP3 and an FMA a
    # weight): the quant GPU tests (every tuner candidate, words and halves), the batch-1
    # sweep of every fp8 / int4 GEMV candidate and the several-token one, int4 in word tiles
    # beside the half-split tiles of before, then B12's batch-1 part and int4's B2.
    QUANT_K="every_tuner_candidate or int4" part quanttests 150 70 quanttests
    part quantbench 260 200 quantbench
    part b12b1 130 75 b12 --parts b1 --name b12_b1_h200
    part b12int4b2 160 100 b12 --parts b2 --schemes bf16,int4 --name b12_int4_b2_h200
    ;;
  33)
    # One H200 after GEMV_PIPE (the next tile's weight loads issued before this tile's
    # arithmetic): the batch-1 GPU tests of every tuner candidate (fp8, int4 in word tiles
    # and in half-split ones), the batch-1 GEMV sweep and the linears, B12's batch-1 part.
    QUANT_K="every_tuner_candidate and (fp8-1] or int4-1] or halves128-1])" \
      part quanttests 120 40 quanttests
    QUANT_GEMM_SWEEP=0 part quantbench 150 60 quantbench
    part b12b1 130 75 b12 --parts b1 --name b12_b1_h200
    ;;
  34)
    # One H200 after the word tiles and GEMV_PIPE were reverted (neither moved int4's
    # one-token GEMV off 1.3-2.1 TB/s): the batch-1 GEMV sweep and linears with int4 at one
    # scale a row instead of groups of 128 (QUANT_INT4_GROUP=row; its quant_kernels JSON is
    # kept as quant_kernels_int4_row_h200.json), then B12's batch-1 part as it ships.
    QUANT_GEMM_SWEEP=0 QUANT_INT4_GROUP=row part quantbench 150 60 quantbench
    part b12b1 130 75 b12 --parts b1 --name b12_b1_h200
    ;;
  35)
    # One H200 after the GEMV loop could be software-pipelined (GEMV_STAGES2 / 3, Triton's
    # tl.range num_stages: int4_gemv_probe_stages_h200.json took a word-tile down from 32 to
    # 19 us): the batch-1 GPU tests of every tuner candidate, the batch-1 GEMV sweep and
    # the linears, B12's batch-1 part.
    QUANT_K="every_tuner_candidate and (fp8-1] or int4-1])" part quanttests 120 40 quanttests
    QUANT_GEMM_SWEEP=0 part quantbench 150 60 quantbench
    part b12b1 130 75 b12 --parts b1 --name b12_b1_h200
    ;;
  37)
    # At 60366c5, where a waiting loop always waited on its sockets itself (no faster there:
    # call 38 has it only with busy polling): inputs tests, the host's hop each way, B1
    # twice, B1 traced, then B3. (Its b1thread parts, B1 with the receiver thread's wait,
    # set TESSERA_INBOX_DIRECT=0, which only 60366c5 read.)
    part inputs 150 80 inputs
    part hop 60 20 hop
    part b1 50 30 b1 --name b1_call62_h200
    part b1again 50 30 b1 --name b1_run2_h200
    part b1traced 60 35 b1 --iters 10 --trace-messages-dir "$RES/b1_trace_h200" \
      --name b1_traced_h200
    part b3 100 65 b3
    ;;
  38)
    # One H200 after --busy-poll-ms (auto: 20 ms on this 16-CPU host): the host's hop each
    # way (bench_hop), B1 as it ships and with --busy-poll-ms 0, alternating twice, B1
    # traced, then B3 (c=128 with four processes polling) and B2.
    part hop 60 25 hop
    part b1 50 30 b1 --name b1_call62_h200
    part b1nopoll 50 30 b1 --busy-poll-ms 0 --name b1_nopoll_h200
    part b1again 50 30 b1 --name b1_run2_h200
    part b1nopollagain 50 30 b1 --busy-poll-ms 0 --name b1_nopoll_run2_h200
    part b1traced 60 35 b1 --iters 10 --trace-messages-dir "$RES/b1_trace_h200" \
      --name b1_traced_h200
    part b3 100 65 b3
    part b2 70 40 b2
    ;;
  39)
    # More runs of B1's time to first token with busy polling, where call 38 met its target
    # at the margin (17.3 / 17.8 ms), one without it between them, the hop benchmark after
    # its fix, and B12's batch-1 part with polling.
    part hop 60 25 hop
    part b1 50 30 b1 --name b1_run3_h200
    part b1nopoll 50 30 b1 --busy-poll-ms 0 --name b1_nopoll_run3_h200
    part b1again 50 30 b1 --name b1_run4_h200
    part b1more 50 30 b1 --name b1_run5_h200
    part b12b1 130 75 b12 --parts b1 --name b12_b1_h200
    ;;
  40)
    # B3 at c=128 decodes 89 streams a step on average (b3_h200.json, call 38): new requests
    # wait for their prefill behind the decode protection's budget (1.8 decode steps a
    # step). B3 with larger mixed steps: what c=128 gains and what c=32's ITL tail pays.
    part b3ratio24 80 65 b3 "--server-args=--max-mixed-step-ratio 2.4" --name b3_ratio24_h200
    part b3ratio30 80 65 b3 "--server-args=--max-mixed-step-ratio 3.0" --name b3_ratio30_h200
    ;;
  41)
    # The one-token GEMV in CUDA C (hal/cuda/native_gemv.py, NVRTC at run time): its GPU
    # tests and the tuner's candidates at batch 1, the batch-1 GEMV sweep with its configs
    # beside the Triton tiles (the tuner's pick per shape), B12's batch-1 part.
    QUANT_K="native or (every_tuner_candidate and (fp8-1] or int4-1]))" \
      part quanttests 150 60 quanttests
    QUANT_GEMM_SWEEP=0 part quantbench 200 90 quantbench
    part b12b1 150 75 b12 --parts b1 --name b12_b1_h200
    ;;
  42)
    # int4's native GEMV streams 3.0 TB/s where fp8's reaches 4.1 on the same pattern (call
    # 41): the kernel beside variants without the group scales, without x, without the
    # arithmetic; and the batch-1 sweep with int4 at one scale a row.
    part nativeprobe 120 60 nativeprobe
    SUFFIX=int4_row_native_h200 QUANT_GEMM_SWEEP=0 QUANT_INT4_GROUP=row part quantbenchrow 150 30 quantbench
    ;;
  43)
    # The native GEMVs' first weight loads before their PDL wait (HAL_CUDA_GEMV_PRELOAD=1:
    # the weights stream while the kernel before finishes) against after it, B12's batch-1
    # part alternated twice. (Measured at 09a097a, where 0 was the default; preload is the
    # default since, so the unflagged parts now run it too: set HAL_CUDA_GEMV_PRELOAD=0 there
    # to repeat the comparison.)
    part b12b1 110 60 b12 --parts b1 --name b12_b1_h200
    HAL_CUDA_GEMV_PRELOAD=1 part b12b1pre 110 60 b12 --parts b1 --name b12_b1_native_preload_h200
    part b12b1again 110 60 b12 --parts b1 --name b12_b1_again_h200
    HAL_CUDA_GEMV_PRELOAD=1 part b12b1preagain 110 60 b12 --parts b1 --name b12_b1_native_preload_again_h200
    ;;
  44)
    # The one-token fusion (QuantLinearKernel.one_token_fused: each RMSNorm the next native
    # GEMV's prologue, each residual add and the SiLU the previous one's epilogue; a decoder
    # layer's batch-1 step in seven kernels where it had ten): its GPU tests (kernel, graph
    # chain, conformance, a served tiny model against the plain path), then B12's batch-1
    # part with it, without it (HAL_CUDA_ONE_TOKEN_FUSION=0), with it again.
    QUANT_FILES="tests/hal_cuda/test_one_token_fusion_gpu.py tests/hal_cuda/test_conformance_gpu.py" \
      QUANT_K="native or fusion or fused or one_token" part quanttests 200 100 quanttests
    part b12b1 110 60 b12 --parts b1 --name b12_b1_h200
    HAL_CUDA_ONE_TOKEN_FUSION=0 part b12b1plain 110 60 b12 --parts b1 --name b12_b1_nofusion_h200
    part b12b1again 110 60 b12 --parts b1 --name b12_b1_fusion_again_h200
    ;;
  45)
    # Call 44: the fusion took fp8's B1 from 2.58 to 2.43 ms, int4's from 2.15 to 2.20-2.23
    # (its GEMV bound by its arithmetic, the norm prologue adds to it). Each fusion against
    # its composition (tests/hal_cuda/fusion_probe.py), the fusion's GPU tests (the kernel
    # tests of call 44 passed; the rest did not run in its 200 s), then B12's batch-1 part
    # under auto (int4 keeps the norm kernel), all (int4 with the norm prologue, as call
    # 44), auto again.
    part fusionprobe 120 60 fusionprobe
    QUANT_FILES="tests/hal_cuda/test_one_token_fusion_gpu.py tests/hal_cuda/test_conformance_gpu.py" \
      QUANT_K="fusion or fused or one_token" part quanttests 200 100 quanttests
    part b12b1 110 60 b12 --parts b1 --name b12_b1_h200
    HAL_CUDA_ONE_TOKEN_FUSION=all part b12b1all 110 60 b12 --parts b1 --name b12_b1_fusion_all_h200
    part b12b1again 110 60 b12 --parts b1 --name b12_b1_fusion_auto_again_h200
    ;;
  46)
    # The qkv product's epilogue also rotates q and k and stores k and v in the cache
    # (rotary_store_kv's launch gone): the probe, the fusion's GPU tests, then B12's batch-1
    # part with the fusion, without it (HAL_CUDA_ONE_TOKEN_FUSION=off), and with it at three
    # steps in flight (whether the host keeps two steps ahead of a 2.4 ms step).
    part fusionprobe 120 60 fusionprobe
    QUANT_FILES="tests/hal_cuda/test_one_token_fusion_gpu.py tests/hal_cuda/test_conformance_gpu.py" \
      QUANT_K="fusion or fused or one_token or rotary" part quanttests 220 170 quanttests
    part b12b1 110 50 b12 --parts b1 --name b12_b1_h200
    HAL_CUDA_ONE_TOKEN_FUSION=off part b12b1plain 110 40 b12 --parts b1 --name b12_b1_nofusion_h200
    part b12b1d3 110 40 b12 --parts b1 --overlap-steps 3 --name b12_b1_fusion_overlap3_h200
    ;;
  47)
    # Call 46's quanttests ran out of its 220 s (every test it reached passed): the rotary
    # epilogue's kernel tests, the PDL graph chain, the served model (int4 under
    # HAL_CUDA_ONE_TOKEN_FUSION=all) and the conformance cases; then B12's batch-1 part with
    # int4 plain by default (quant_linear.AUTO_SCHEMES: fp8 only).
    QUANT_FILES="tests/hal_cuda/test_one_token_fusion_gpu.py tests/hal_cuda/test_conformance_gpu.py" \
      QUANT_K="one_token or rotary_epilogue or fused_layer_chain" part quanttests 200 100 quanttests
    part b12b1 110 50 b12 --parts b1 --name b12_b1_h200
    ;;
  48)
    # A decode step's attention runs a program a (request, KV head) in the batch's order:
    # the kernel over B2's and B3's spreads of context lengths, in a random order and longest
    # first, its grid heads-first and batch-first; then B2 and B3 with the scheduler's
    # longest-first decodes and the heads-first grid (the defaults since), and as before
    # (--decode-order arrival, HAL_CUDA_DECODE_GRID=batch), alternated.
    part attnorder 90 40 attnorder
    part b2 110 70 b2 --name b2_h200
    HAL_CUDA_DECODE_GRID=batch part b2before 110 70 b2 --decode-order arrival \
      --name b2_arrival_h200
    part b3 120 80 b3 --name b3_h200
    HAL_CUDA_DECODE_GRID=batch part b3before 120 80 b3 "--server-args=--decode-order arrival" \
      --name b3_arrival_h200
    ;;
  49)
    # Call 48 again in the other order (before first), with the order bench's new cases
    # (b2_64 other draws, batches 48 / 80 / 96, two and four splits), and B1.
    SUFFIX=more_h200 part attnorder 120 60 attnorder
    HAL_CUDA_DECODE_GRID=batch part b2before 110 70 b2 --decode-order arrival \
      --name b2_arrival_again_h200
    part b2 110 70 b2 --name b2_again_h200
    HAL_CUDA_DECODE_GRID=batch part b3before 120 80 b3 "--server-args=--decode-order arrival" \
      --name b3_arrival_again_h200
    part b3 120 80 b3 --name b3_again_h200
    part b1 90 45 b1 --name b1_h200
    ;;
  50)
    # Two splits at least below five programs a multiprocessor (decode_attention.splits_for:
    # 33-82 decodes, one split before): the order bench, B2 twice, B3, B1.
    SUFFIX=splits_h200 part attnorder 120 60 attnorder
    part b2 110 40 b2 --name b2_splits_h200
    part b3 120 70 b3 --name b3_splits_h200
    part b2again 110 40 b2 --name b2_splits_again_h200
    part b1 90 25 b1 --name b1_splits_h200
    ;;
  51)
    # Issue 17's B2 after the decode order (calls 48-50): the order bench again, now with
    # the fp8 cache at a few tiles (and, at 2fdf9f3, FP8_SWAP_QK: the converted keys the
    # scores' first operand; not kept); B12's B2 with bf16 and fp8 weights over the bf16
    # cache, then the fp8 cache.
    SUFFIX=fp8_h200 part attnorder 120 60 attnorder
    part b12b2 150 80 b12 --schemes bf16,fp8 --parts b2 --name b12_b2_order_h200
    part b12kvfp8 150 80 b12 --schemes bf16,fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_order_h200
    ;;
  52)
    # Call 50's c=32 ITL p99 was 14.3 ms (11.3-11.7 in calls 48-49, either order): B3 a
    # third time each way.
    part b3 120 65 b3 --name b3_third_h200
    HAL_CUDA_DECODE_GRID=batch part b3before 120 65 b3 "--server-args=--decode-order arrival" \
      --name b3_arrival_third_h200
    ;;
  53)
    # EARLY_KV (decode attention's first key tile loaded before its griddepcontrol.wait, the
    # newest token's K/V after; off by default until this call has run) and the loop's
    # register prefetch (FP8_REG_PREFETCH / REG_PREFETCH, one stage; off by default): the
    # decode-attention GPU tests (each with the prefetch and without) and the PDL chain
    # against plain launches (bit for bit) with EARLY_KV; the prefetch bench's tiles; B1 with
    # EARLY_KV, without, with; B12's fp8 B2 over the fp8 cache with the prefetch (at four
    # warps) and without. The prefetch, its bench part and its tests ran at 665d7c9 and were
    # removed after (slower at every batch but one: docs/performance.md); run this call at
    # that commit.
    HAL_CUDA_DECODE_EARLY_KV=1 KERNELS_K="decode_attention or (pdl_decode_chain and bf16)" \
      part kernels 90 50 kernels
    SUFFIX=h200 part attnprefetch 150 70 attnprefetch
    HAL_CUDA_DECODE_EARLY_KV=1 part b1 45 20 b1 --name b1_earlykv_h200
    part b1plain 45 20 b1 --name b1_noearlykv_h200
    HAL_CUDA_DECODE_EARLY_KV=1 part b1again 45 20 b1 --name b1_earlykv_again_h200
    HAL_CUDA_DECODE_FP8_PREFETCH=1 part b12pf 120 70 b12 --schemes fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name b12_fp8kv_prefetch_h200
    part b12plain 120 70 b12 --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_noprefetch_h200
    ;;
  54)
    # Decode attention over the fp8 cache with the keys' words read in the order the scores'
    # dot takes them (FP8_PERMUTE_K: no two-byte reads back from shared memory; off by
    # default until this call has run): the decode-attention GPU tests (each with it and
    # without) and the PDL chain with it; the permute bench's tiles; B12's fp8 B2 over the
    # fp8 cache with it, without, with; then B2 and B3 at this commit (issue 13's figures).
    # FP8_PERMUTE_K, its bench part and its tests ran at 25b2125 and were removed after
    # (1.6x slower: docs/performance.md); run this call at that commit.
    HAL_CUDA_DECODE_FP8_PERMUTE_K=1 KERNELS_K="decode_attention or pdl_decode_chain" \
      part kernels 90 50 kernels
    SUFFIX=h200 part attnpermute 150 45 attnpermute
    HAL_CUDA_DECODE_FP8_PERMUTE_K=1 part b12pk 100 45 b12 --schemes fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name b12_fp8kv_permk_h200
    part b12plain 100 45 b12 --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_nopermk_h200
    HAL_CUDA_DECODE_FP8_PERMUTE_K=1 part b12pkagain 100 45 b12 --schemes fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name b12_fp8kv_permk_again_h200
    part b2 110 45 b2 --name b2_call54_h200
    part b3 120 80 b3 --name b3_call54_h200
    ;;
  55)
    # What the counters say (the first call with ncu): decode attention's stage 1 over B2's
    # 256 requests, bf16 cache and fp8 (the fp8 one reads its bytes at 2.8 TB/s, the bf16 one
    # at 4.35), and 32 requests over the fp8 cache at two tiles; the four projections at 256
    # tokens (bf16 GEMM, fp8 W8A8) and one token (fp8, int4 GEMVs).
    SUFFIX=h200 part ncu 400 200 ncu
    ;;
  56)
    # After call 55's counters: W8A8 tiles of 64 x 64, K steps of 256 and K splits of 2 in
    # the tuner's lists at 64-256 tokens. Their GPU tests (every tuner candidate against
    # the definition); every fp8 candidate of 64-256 tokens at the four shapes beside bf16
    # (quant_kernels_w8a8_h200.json); B12's B2 in bf16 and fp8, then fp8 over the fp8 cache.
    QUANT_K="(every_tuner_candidate and fp8) or w8a8" part quanttests 120 60 quanttests
    QUANT_PARTS=w8a8 SUFFIX=w8a8_h200 part quantbench 180 120 quantbench
    part b12b2 200 130 b12 --schemes bf16,fp8 --parts b2 --name b12_b2_call56_h200
    part b12kv 130 90 b12 --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_call56_h200
    ;;
  57)
    # Decode attention over the fp8 cache under a register cap (FP8_MAXNREG, Triton's
    # maxnreg): call 55 found the default tile at 182 registers, four programs and 8 warps an
    # SM. The decode-attention GPU tests (the fp8 one at capped tiles too); the tile bench;
    # then B12's fp8 B2 over the fp8 cache at the bench's fastest tile over B2's batches
    # (HAL_CUDA_DECODE_FP8_TILE), at the default, and at the fastest again.
    KERNELS_K="decode_attention" part kernels 90 50 kernels
    SUFFIX=h200 part attnregs 180 100 attnregs
    tile=$("$PY" benchmarks/pick_tile.py "$RES/attention_regs_h200/gpu_run.json" 2>>"$LOG")
    say "fastest fp8 tile over B2's batches: ${tile:-none (the default kept)}"
    HAL_CUDA_DECODE_FP8_TILE=${tile:-64,2,3} part b12tile 100 45 b12 --schemes fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name b12_fp8kv_tile_call57_h200
    part b12kv 100 45 b12 --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_call57_h200
    HAL_CUDA_DECODE_FP8_TILE=${tile:-64,2,3} part b12tile2 100 45 b12 --schemes fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name b12_fp8kv_tile_again_call57_h200
    ;;
  58)
    # The keys unconverted in an e4m3 dot (FP8_QDOT: q split in two e4m3 parts, keys x q^T
    # as an fp8 wgmma; V converted as before), after call 57 found no register cap faster:
    # the decode-attention GPU tests (with it at two tiles), the tile bench; B12's fp8 B2 over
    # the fp8 cache with it (at the bench's fastest of its tiles), without, with; the fp8
    # cache's KL against bf16 (kv_fp8_kl) with it and without. FP8_QDOT, its tests and bench
    # tiles ran at 7da3f49 and were removed after (slower: docs/performance.md); run this call
    # at that commit.
    KERNELS_K="decode_attention" part kernels 90 30 kernels
    SUFFIX=h200 part attnregs 180 50 attnregs
    qtile=$("$PY" benchmarks/pick_tile.py "$RES/attention_regs_h200/gpu_run.json" --qdot \
      2>>"$LOG")
    say "fastest tile with the keys' e4m3 dot over B2's batches: ${qtile:-none (1: its default)}"
    HAL_CUDA_DECODE_FP8_QDOT=${qtile:-1} part b12qdot 100 45 b12 --schemes fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name b12_fp8kv_qdot_call58_h200
    part b12kv 100 35 b12 --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_call58_h200
    HAL_CUDA_DECODE_FP8_QDOT=${qtile:-1} part b12qdot2 100 35 b12 --schemes fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name b12_fp8kv_qdot_again_call58_h200
    HAL_CUDA_DECODE_FP8_QDOT=${qtile:-1} part kvklqdot 150 80 b12 --schemes bf16 --parts kl \
      --name b12_kvkl_qdot_call58_h200
    part kvkl 150 80 b12 --schemes bf16 --parts kl --name b12_kvkl_call58_h200
    ;;
  59)
    # The fp8 product's activations quantized in the norm's and the SiLU's kernels
    # (QuantLinearKernel.rows_fused, LlamaDecoderLayer.forward_rows_fused: three launches a
    # layer fewer at two tokens and more), and the fp8 cache's tile for 16-32 requests. Their
    # GPU tests (rows_fused against its composition bit for bit and in the conformance
    # suite, the fp8 decode attention at 24 requests); B12's B2 in bf16 and fp8, fp8 with the
    # fusion off (HAL_CUDA_FP8_ROWS_FUSION=0), fp8 over the fp8 cache, fp8 again.
    KERNELS_K="decode_attention or rows_fused" part kernels 90 30 kernels
    QUANT_K="rows_fused" part quanttests 90 30 quanttests
    part b12b2 200 90 b12 --schemes bf16,fp8 --parts b2 --name b12_b2_call59_h200
    HAL_CUDA_FP8_ROWS_FUSION=0 part b12nofuse 100 45 b12 --schemes fp8 --parts b2 \
      --name b12_b2_nofusion_call59_h200
    part b12kv 100 45 b12 --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_call59_h200
    part b12fp8 100 45 b12 --schemes fp8 --parts b2 --name b12_b2_fp8_again_call59_h200
    ;;
  60)
    # After call 59 (B12 fp8 B2 12199 / 12436 fused against 12189 without: within a draw's
    # spread): the rows_fused GPU tests as corrected; the fp8 step profile's steps and kernel
    # tables with the fusion and without (what a step saves, without B2's spread); one more
    # B2 pair.
    KERNELS_K="rows_fused" part kernels 60 20 kernels
    QUANT_K="rows_fused" part quanttests 60 20 quanttests
    PROFILE_ONLY="steps traces" PROFILE_QUANT=fp8 SUFFIX=fused_h200 part profile_fp8 150 100 \
      profile
    HAL_CUDA_FP8_ROWS_FUSION=0 PROFILE_ONLY="steps traces" PROFILE_QUANT=fp8 \
      SUFFIX=nofusion_h200 part profile_nofusion 150 100 profile
    HAL_CUDA_FP8_ROWS_FUSION=0 part b12nofuse 100 30 b12 --schemes fp8 --parts b2 \
      --name b12_b2_nofusion_call60_h200
    part b12fp8 100 30 b12 --schemes fp8 --parts b2 --name b12_b2_fp8_call60_h200
    ;;
  61)
    # Call 60's timed eager steps took twice the host time with the fusion (76 against 29 ms
    # a 2048-token step) where its profiler traces, later in the same processes, had it 38%
    # faster (54 against 88 ms): the steps again in the other order, then a B2 pair.
    HAL_CUDA_FP8_ROWS_FUSION=0 PROFILE_ONLY="steps" PROFILE_QUANT=fp8 \
      SUFFIX=nofusion_again_h200 part profile_nofusion 120 60 profile
    PROFILE_ONLY="steps" PROFILE_QUANT=fp8 SUFFIX=fused_again_h200 part profile_fp8 120 60 \
      profile
    part b12fp8 100 30 b12 --schemes fp8 --parts b2 --name b12_b2_fp8_call61_h200
    HAL_CUDA_FP8_ROWS_FUSION=0 part b12nofuse 100 30 b12 --schemes fp8 --parts b2 \
      --name b12_b2_nofusion_call61_h200
    ;;
  62)
    # Issue 13's figures (none since call 54), with the engine processes' start-up heaps
    # frozen out of the garbage collector (--gc-freeze, the default since this call) and
    # without, then B2 traced step by step without it: which steps of B2 take 100-250 ms
    # (14 in call 54), and whether a collector's pause lies inside them.
    part b1 50 30 b1 --name b1_call62_h200
    part b2 60 35 b2 --name b2_call62_h200
    part b2nofreeze 60 35 b2 --no-gc-freeze --name b2_nofreeze_call62_h200
    part b2traced 80 40 b2 --no-gc-freeze --trace-messages-dir "$RES/b2_trace_call62" \
      --name b2_traced_nofreeze_call62_h200
    part b3 90 65 b3 --name b3_call62_h200
    ;;
  63)
    # Issue 17's figures at one commit (B12's B1 none since call 47), after the fp8 rows
    # fusion and the fp8 cache's small-batch tile.
    part b12b1 130 75 b12 --parts b1 --name b12_b1_call63_h200
    part b12b2 200 90 b12 --schemes bf16,fp8 --parts b2 --name b12_b2_call63_h200
    part b12kv 100 45 b12 --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_call63_h200
    ;;
  64)
    # Where a decode step of B2 at 256 requests goes: the worker profiled over 8 steps where
    # all 256 decode (worker steps 200-207) and 8 of the drain (800-807), summarized by
    # profile_summary (device busy against the window's wall), the traces gzipped beside.
    part b2prof 120 70 b2 --profile-dir "$RES/b2_profile_call64" \
      --profile-steps "${PROFILE_STEPS:-200:8,800:8}" --name b2_profiled_call64_h200
    if [[ -d $RES/b2_profile_call64 ]]; then
      "$PY" -m tessera.benchmarks.profile_summary "$RES/b2_profile_call64" \
        --out "$RES/b2_profile_summary_call64_h200.json" >/dev/null 2>>"$LOG" ||
        say "profile summary failed"
      gzip -f "$RES"/b2_profile_call64/*.trace.json 2>/dev/null || true
    fi
    ;;
  65)
    # The decode graphs' logits left in the LM head's bf16 where a step only takes argmaxes
    # (no float32 copy of 256 x 128k logits written and copied again a step): the sample
    # op's conformance and kernel tests, engine parity, then B2 twice, B3, B12's B2.
    KERNELS_K="sample or argmax" part kernels 120 40 kernels
    part inputs 150 60 inputs
    part b2 60 35 b2 --name b2_call65_h200
    part b2again 60 35 b2 --name b2_again_call65_h200
    part b3 90 65 b3 --name b3_call65_h200
    part b12b2 200 90 b12 --schemes bf16,fp8 --parts b2 --name b12_b2_call65_h200
    ;;
  67)
    # The LM head quantized at load too (--quantize-lm-head): B12's KL and B1 for every
    # scheme with and without it, then B2 bf16 / fp8 / fp8 with the head.
    part b12b1 330 250 b12 --schemes bf16,fp8,fp8+head,int4,int4+head --parts kl,b1 \
      --name b12_b1_call67_h200
    part b12b2 220 130 b12 --schemes bf16,fp8,fp8+head --parts b2 --name b12_b2_call67_h200
    ;;
  69)
    # W8A8 tiles with the fp8 dots accumulating in place (A8F) among the tuner's candidates
    # at 33-128 tokens: every candidate's GPU test, then B12's B2 bf16 / fp8, fp8 without
    # them (HAL_CUDA_FP8_A8F=0), fp8 with them again, and fp8 over the fp8 cache.
    QUANT_K="every_tuner_candidate" part quanttests 90 40 quanttests
    part b12b2 200 90 b12 --schemes bf16,fp8 --parts b2 --name b12_b2_call69_h200
    HAL_CUDA_FP8_A8F=0 part b12noa8f 100 45 b12 --schemes fp8 --parts b2 \
      --name b12_b2_noa8f_call69_h200
    part b12again 100 45 b12 --schemes fp8 --parts b2 --name b12_b2_again_call69_h200
    part b12kv 100 45 b12 --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
      --name b12_fp8kv_call69_h200
    ;;
  70)
    # A8F tiles of 64 rows at 17-32 tokens too: every tuner candidate's GPU test, then B3's
    # c=32 tier over fp8 weights with them and without (HAL_CUDA_FP8_A8F=0), twice.
    QUANT_K="every_tuner_candidate" part quanttests 90 40 quanttests
    part b3fp8 80 40 b3 --server-args "--quantization fp8" --concurrency 32 --name b3_fp8_c32_call70_h200
    HAL_CUDA_FP8_A8F=0 part b3fp8noa8f 80 40 b3 --server-args "--quantization fp8" --concurrency 32 \
      --name b3_fp8_c32_noa8f_call70_h200
    part b3fp8again 80 40 b3 --server-args "--quantization fp8" --concurrency 32 \
      --name b3_fp8_c32_again_call70_h200
    HAL_CUDA_FP8_A8F=0 part b3fp8noa8fagain 80 40 b3 --server-args "--quantization fp8" --concurrency 32 \
      --name b3_fp8_c32_noa8f_again_call70_h200
    ;;
  72)
    # Where the device's c=128 tier loses to the simulator's (12.9 ms a step against 11.1;
    # the host processes on the fake worker keep 99.7% of it, host_model_cpu), and why the
    # prefill backlog rule lost there (call 71) where the simulator said it gains: the tier
    # traced step by step with its prefill steps filled into their padding (the default),
    # without, and with the backlog rule, each step's interval beside what the simulator's
    # model charges its composition (as run and as padded) and the time the device sat idle
    # (step_trace --cost-model tokens); the raw traces in their own archive.
    for variant in "fill:" "nofill:--no-fill-padded-steps" \
        "backlog16:--prefill-backlog-steps 16"; do
      traced_c128 "$variant" call72
    done
    pack
    ;;
  73)
    # Prefill steps grown into their graphs' padding (--fill-padded-steps, off by default
    # until this measured it) against the measured budget alone (then the default), B3
    # alternating, twice, then the session's B2. Ran at 89cb004 on an H100 (its results were
    # lost with the session's machine; call 75 measures the same at later commits, where the
    # filling is the default and both halves here would fill).
    # (B2 last: a short budget drops it before either half of the comparison)
    part b3fill 90 65 b3 --server-args=--fill-padded-steps --name b3_fill_call73_h200
    part b3 90 65 b3 --name b3_call73_h200
    part b3fillagain 90 65 b3 --server-args=--fill-padded-steps --name b3_fill_again_call73_h200
    part b3again 90 65 b3 --name b3_again_call73_h200
    part b2 60 35 b2 --name b2_call73_h200
    ;;
  74)
    # Call 75's comparison in less device time: B3's c=128 tier alone, with the prefill steps
    # filled into their padding (the default) and without, alternating, twice.
    part b3c128fill 70 50 b3 --concurrency 128 --name b3_c128_fill_call74_h200
    part b3c128 70 50 b3 --concurrency 128 --server-args=--no-fill-padded-steps \
      --name b3_c128_nofill_call74_h200
    part b3c128fillagain 70 50 b3 --concurrency 128 --name b3_c128_fill_again_call74_h200
    part b3c128again 70 50 b3 --concurrency 128 --server-args=--no-fill-padded-steps \
      --name b3_c128_nofill_again_call74_h200
    ;;
  75)
    # Issue 13's figures at the session's commit, prefill steps filled into their padding
    # (the default since call 73 measured it on an H100) against the measured budget alone
    # (--no-fill-padded-steps), B3 alternating, twice, then B2 and B1.
    part b3 90 65 b3 --name b3_call75_h200
    part b3nofill 90 65 b3 --server-args=--no-fill-padded-steps --name b3_nofill_call75_h200
    part b3again 90 65 b3 --name b3_again_call75_h200
    part b3nofillagain 90 65 b3 --server-args=--no-fill-padded-steps \
      --name b3_nofill_again_call75_h200
    part b2 60 35 b2 --name b2_call75_h200
    part b1 50 30 b1 --name b1_call75_h200
    ;;
  76)
    # Issue 17's figures at the session's commit (B12's B1 for every scheme, B2 bf16 / fp8),
    # then B3's c=128 tier traced step by step with the padding filled (the default) and
    # without: where its steps lose to the simulator's.
    part b12b1 130 75 b12 --parts b1 --name b12_b1_call76_h200
    part b12b2 200 90 b12 --schemes bf16,fp8 --parts b2 --name b12_b2_call76_h200
    for variant in "fill:" "nofill:--no-fill-padded-steps"; do
      traced_c128 "$variant" call76
    done
    ;;
  71)
    # The prefill backlog rule (--prefill-backlog-steps 16: the default at 200bd83, where
    # the call ran; off since) against the protected chunks alone (0), B3 alternating, twice,
    # beside the session's B2.
    part b2 60 35 b2 --name b2_call71_h200
    part b3 90 65 b3 --server-args "--prefill-backlog-steps 16" --name b3_call71_h200
    part b3off 90 65 b3 --server-args "--prefill-backlog-steps 0" --name b3_nobacklog_call71_h200
    part b3again 90 65 b3 --server-args "--prefill-backlog-steps 16" --name b3_again_call71_h200
    part b3offagain 90 65 b3 --server-args "--prefill-backlog-steps 0" \
      --name b3_nobacklog_again_call71_h200
    ;;
  68)
    # Issue 13's figures at the session's commit (the fused merge of call 66 reverted).
    part b1 50 30 b1 --name b1_call68_h200
    part b2 60 35 b2 --name b2_call68_h200
    part b2again 60 35 b2 --name b2_again_call68_h200
    part b3 90 65 b3 --name b3_call68_h200
    ;;
  77)
    # Issue 13's figures at the session's commit, padding filled (the default): B2, B3, B2
    # again, so B3's c=128 ratio has a B2 on either side of it (~190 s).
    part b2 60 35 b2 --name b2_call77_h200
    part b3 90 65 b3 --name b3_call77_h200
    part b2again 60 35 b2 --name b2_again_call77_h200
    ;;
  78)
    # The token GEMM (hal/cuda/token_gemm.py): the probe (every candidate against cuBLAS at
    # the 8B shapes, 2-256 tokens), its GPU tests, then B2 and B3 with the probe's picks
    # (HAL_CUDA_TOKEN_GEMM_TABLE) against cuBLAS alone (HAL_CUDA_TOKEN_GEMM=off), alternating.
    # A card whose probe is committed (the H100's, call 78) takes those picks: no second probe.
    picks=$RES/token_gemm_probe_$CARD.json
    if [[ $CARD != h200 && -s benchmarks/results/token_gemm_probe_$CARD.json ]]; then
      say "tokengemm: the committed benchmarks/results/token_gemm_probe_$CARD.json, not probed again"
      picks=benchmarks/results/token_gemm_probe_$CARD.json
    else
      part tokengemm 200 110 tokengemm
    fi
    part tokengemmtests 150 100 tokengemmtests
    [[ $DRY == 1 ]] && picks=$RES/token_gemm_probe_dry.json
    if [[ -s $picks ]]; then
      HAL_CUDA_TOKEN_GEMM_TABLE=$picks part b2tg 60 35 b2 --name b2_tokengemm_${TAG:-call78}_h200
      HAL_CUDA_TOKEN_GEMM=off part b2 60 35 b2 --name b2_cublas_${TAG:-call78}_h200
      HAL_CUDA_TOKEN_GEMM_TABLE=$picks part b3tg 90 65 b3 --name b3_tokengemm_${TAG:-call78}_h200
      HAL_CUDA_TOKEN_GEMM=off part b3 90 65 b3 --name b3_cublas_${TAG:-call78}_h200
    else
      say "no probe picks ($picks): B2 and B3 not run"
    fi
    ;;
  80)
    # Where B1's decode step goes on the device, per scheme (issue 17's fp8 / int4 gaps): the
    # worker profiled over 16 decode steps inside the fourth request (b1_profiled), bf16 /
    # fp8 / int4 weights; then B12's B1 part.
    for scheme in bf16 fp8 int4; do b1_profiled "$scheme" "${TAG:-call80}"; done
    part b12b1 150 75 b12 --parts b1 --name "b12_b1_${TAG:-call80}_h200"
    ;;
  81)
    # What ran at 6ad132e for the streamed native GEMV (native_gemv.py qgemv_stream: weight
    # runs through a cp.async ring in shared memory, persistent grids; HAL_CUDA_GEMV_STREAM=1
    # listed its configs): the native GPU tests, the batch-1 GEMV sweep, B12's B1 part, then
    # B1 profiled over int4 and fp8 weights. The streamed GEMV was slower than the plain
    # native kernel on every shape and was removed after this call; the case now runs the
    # plain kernels only (native_stream matches no test).
    QUANT_K="native_gemv_every or native_stream or native_gemv_under_pdl or falls_back" \
      part quanttests 170 90 quanttests
    QUANT_GEMM_SWEEP=0 part quantbench 200 100 quantbench
    part b12b1 150 75 b12 --parts b1 --name "b12_b1_${TAG:-call81}_h200"
    for scheme in int4 fp8; do b1_profiled "$scheme" "${TAG:-call81}"; done
    ;;
  82)
    # Call 81 on a short budget: the batch-1 GEMV sweep first (every candidate's time and
    # error against the definition), then the native GPU tests, then B12's B1 part. Written
    # for the streamed GEMV at 6ad132e (HAL_CUDA_GEMV_STREAM=1), removed after call 81: the
    # case now runs the plain kernels only.
    QUANT_GEMM_SWEEP=0 part quantbench 200 100 quantbench
    QUANT_K="native_gemv_every or native_stream or native_gemv_under_pdl or falls_back" \
      part quanttests 170 90 quanttests
    part b12b1 150 75 b12 --parts b1 --name "b12_b1_${TAG:-call82}_h200"
    ;;
  83)
    # Decode attention's first tile read before its PDL wait (HAL_CUDA_DECODE_PRELOAD=1: the
    # lengths -> slots -> older K / V chain runs while the qkv product or the rotary store
    # finishes): the PDL chain and decode tests with it (and the native GEMV's PDL test),
    # then B12's batch-1 part alternated twice with it and without, then B1 fp8 profiled.
    # What ran at b21705a: within the spread (docs/performance.md), reverted after; the
    # switch is gone, so the case now runs the plain stage 1 both ways.
    KERNELS_K="pdl_decode_chain or decode" part kernels 170 80 kernels
    QUANT_K="native_gemv_under_pdl" part quanttests 120 40 quanttests
    HAL_CUDA_DECODE_PRELOAD=1 part b12b1pre 120 75 b12 --parts b1 \
      --name "b12_b1_preload_${TAG:-call83}_h200"
    part b12b1 120 75 b12 --parts b1 --name "b12_b1_${TAG:-call83}_h200"
    HAL_CUDA_DECODE_PRELOAD=1 part b12b1preagain 120 75 b12 --parts b1 \
      --name "b12_b1_preload_again_${TAG:-call83}_h200"
    part b12b1again 120 75 b12 --parts b1 --name "b12_b1_again_${TAG:-call83}_h200"
    HAL_CUDA_DECODE_PRELOAD=1 b1_profiled fp8 "${TAG:-call83}_preload"
    ;;
  84)
    # After the streamed GEMV and the decode preload were removed: the native GEMV's GPU
    # tests, the PDL decode chain, then B12's batch-1 part.
    QUANT_K="native or falls_back" part quanttests 150 60 quanttests
    KERNELS_K="pdl_decode_chain" part kernels 120 40 kernels
    part b12b1 120 75 b12 --parts b1 --name "b12_b1_${TAG:-call84}_h200"
    ;;
  85)
    # The token GEMM on the card it was written for (call 78 and 79 ran on H100s, where
    # cuBLAS already streams its small products at ~88% and the picks did not pay): the probe
    # at the 8B shapes, 2-256 tokens, then B2 with its picks (HAL_CUDA_TOKEN_GEMM_TABLE)
    # against cuBLAS alone (HAL_CUDA_TOKEN_GEMM=off), alternated twice, then B3 both ways.
    # Any other card runs nothing: its figures would not decide TUNED["H200"].
    if [[ $CARD != h200 && $DRY != 1 ]]; then
      say "call 85 is for an H200 (this is $CARD): nothing run"
      echo "call 85: not run on $CARD" >>"$SUMMARY"
      exit 4
    fi
    tag=${TAG:-call85}
    part tokengemm 150 110 tokengemm
    picks=$RES/token_gemm_probe_$CARD.json
    [[ $DRY == 1 ]] && picks=$RES/token_gemm_probe_dry.json
    if [[ -s $picks ]]; then
      cp "$picks" "$RES/token_gemm_probe_${tag}_$CARD.json"
      HAL_CUDA_TOKEN_GEMM_TABLE=$picks part b2tg 60 35 b2 --name "b2_tokengemm_${tag}_h200"
      HAL_CUDA_TOKEN_GEMM=off part b2 60 35 b2 --name "b2_cublas_${tag}_h200"
      HAL_CUDA_TOKEN_GEMM_TABLE=$picks part b2tg2 60 35 b2 --name "b2_tokengemm_again_${tag}_h200"
      HAL_CUDA_TOKEN_GEMM=off part b2_2 60 35 b2 --name "b2_cublas_again_${tag}_h200"
      HAL_CUDA_TOKEN_GEMM_TABLE=$picks part b3tg 90 65 b3 --name "b3_tokengemm_${tag}_h200"
      HAL_CUDA_TOKEN_GEMM=off part b3 90 65 b3 --name "b3_cublas_${tag}_h200"
    else
      say "no probe picks ($picks): B2 and B3 not run"
    fi
    ;;
  86)
    # Decode attention over the fp8 cache in CUDA C (native_attention, HAL_CUDA_DECODE_NATIVE):
    # its GPU tests with the decode / extend attention tests, the bench beside the Triton
    # stage 1, then B12's B2 over the fp8 cache (bf16 and fp8 weights) with it and without,
    # and over a bf16 cache. Any card: the A/B is within one run.
    tag=${TAG:-call86}
    part nativeattntests 200 100 nativeattntests
    part nativeattn 150 80 nativeattn
    HAL_CUDA_DECODE_NATIVE=1 part b12nat 130 70 b12 --schemes bf16,fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_native_${tag}_h200"
    HAL_CUDA_DECODE_NATIVE=0 part b12tri 130 70 b12 --schemes bf16,fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_triton_${tag}_h200"
    part b12bf16kv 130 70 b12 --schemes bf16,fp8 --parts b2 --name "b12_b2_${tag}_h200"
    ;;
  87)
    # The native stage 1 through cp.async rings (be899ec): its GPU tests, the bench over
    # (warps, stages), then B12's B2 over the fp8 cache at the bench's fastest tile over B2's
    # spreads, with it and without, alternated (the second pair fp8 weights alone).
    tag=${TAG:-call87}
    native_prologue 60
    HAL_CUDA_DECODE_NATIVE=1 HAL_CUDA_DECODE_NATIVE_TILE=$tile part b12nat 130 70 b12 \
      --schemes bf16,fp8 --parts b2 --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_native_${tag}_h200"
    HAL_CUDA_DECODE_NATIVE=0 part b12tri 130 60 b12 --schemes bf16,fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_triton_${tag}_h200"
    HAL_CUDA_DECODE_NATIVE=1 HAL_CUDA_DECODE_NATIVE_TILE=$tile part b12nat2 90 40 b12 \
      --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_native_again_${tag}_h200"
    HAL_CUDA_DECODE_NATIVE=0 part b12tri2 90 40 b12 --schemes fp8 --parts b2 \
      --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_triton_again_${tag}_h200"
    ;;
  88)
    # Call 87 in less device time: the tests, the bench, B12's fp8 B2 over the fp8 cache
    # (fp8 weights alone) with the native stage 1 at the default tile and without, twice.
    tag=${TAG:-call88}
    NATIVE_K=native part nativeattntests 120 40 nativeattntests
    part nativeattn 150 50 nativeattn
    for round in 1 2; do
      HAL_CUDA_DECODE_NATIVE=1 part "b12nat$round" 80 40 b12 --schemes fp8 --parts b2 \
        --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_native_${round}_${tag}_h200"
      HAL_CUDA_DECODE_NATIVE=0 part "b12tri$round" 80 40 b12 --schemes fp8 --parts b2 \
        --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_triton_${round}_${tag}_h200"
    done
    ;;
  89)
    # The native stage 1 with fewer instructions a tile (its e4m3 conversions take the word's
    # halves as they are, a slot's address one 32 x 32 -> 64 multiply-add, the accumulators'
    # rescale only where a max moved): its GPU tests, the bench (the fastest tile also with
    # its loads alone), then B12's fp8 B2 over the fp8 cache at that tile and with Triton's
    # stage 1, alternated twice.
    tag=${TAG:-call89}
    native_prologue 40
    for round in 1 2; do
      HAL_CUDA_DECODE_NATIVE=1 HAL_CUDA_DECODE_NATIVE_TILE=$tile part "b12nat$round" 90 40 b12 \
        --schemes fp8 --parts b2 --kv-cache-dtype fp8_e4m3 \
        --name "b12_fp8kv_native_${round}_${tag}_h200"
      HAL_CUDA_DECODE_NATIVE=0 part "b12tri$round" 90 40 b12 --schemes fp8 --parts b2 \
        --kv-cache-dtype fp8_e4m3 --name "b12_fp8kv_triton_${round}_${tag}_h200"
    done
    ;;
  90)
    # Why the native stage 1's loads alone are slower than Triton's whole kernel (call 89):
    # its loads as they are, with whole-line K requests, and with a block over a request's
    # KV heads (a warp a head, so a slot's 1 KB is read together), beside Triton's stage 1;
    # then the whole kernel laid out so, timed and checked against Triton; its GPU test first
    # (against the reference, one split and three merged).
    NATIVE_K=probe4 part nativeattntests 100 30 nativeattntests
    part nativeattnprobe 150 60 nativeattnprobe
    ;;
  91)
    # int4's one-token GEMV at the sum of its loads and its arithmetic (call 42): the
    # arithmetic on the tensor cores (0.625 integer instructions a weight against 1.125),
    # over a copy of the weight whose 64-byte tiles are interleaved 8 rows at a time so a
    # warp still loads 512 contiguous bytes (call 41's mma variant read 64 of 8 rows); beside
    # the CUDA C GEMV's configs, each checked against the float reference; and its loads
    # alone, and without x's staging (what the interleaved pattern and the prologue cost).
    part int4mmaprobe 200 90 int4mmaprobe
    # then through the tuner (HAL_CUDA_INT4_MMA=1 lists its configs after the CUDA-core
    # ones): its GPU tests, and B12's int4 B1 with it and without, alternated twice
    QUANT_K="int4_mma" part quanttests 120 40 quanttests
    HAL_CUDA_INT4_MMA=1 part b12mma 100 45 b12 --schemes int4 --parts b1 \
      --name "b12_b1_int4_mma_${TAG:-call91}_h200"
    part b12plain 100 45 b12 --schemes int4 --parts b1 --name "b12_b1_int4_${TAG:-call91}_h200"
    HAL_CUDA_INT4_MMA=1 part b12mmaagain 100 45 b12 --schemes int4 --parts b1 \
      --name "b12_b1_int4_mma_again_${TAG:-call91}_h200"
    part b12plainagain 100 45 b12 --schemes int4 --parts b1 \
      --name "b12_b1_int4_again_${TAG:-call91}_h200"
    ;;
esac
for extra in ${EXTRA_PARTS:-}; do
  part "$extra" 200 0 "$extra"
done
pack
rm -rf "$RES"
say "call $CALL done in $((SECONDS - start))s; results: $OUT"
cat "$SUMMARY" >&2
