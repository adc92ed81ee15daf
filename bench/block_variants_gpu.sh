#!/usr/bin/env bash
# One device call: the block kernel's variants (bench/block_variants.py) against the shipped kernel,
# every cell checked bit for bit; one variant's phases; the block path's GPU tests (TESTS_ON: on a variant). At most 9
# minutes: its steps time out at 330 (AB_TIMEOUT) + 120 + 90 s (+ 60 with PHASES_OF), within the device tool's 600.
#   bash bench/block_variants_gpu.sh   (results in $OUT: variants_ab.json, variant_phases.json, log.txt)
#   (session 30 shipped scan and the sampled keep, sampled_fast; the calls that timed them: docs/benchmarks_select_kernel.md)
#   VARIANTS="prefetch512 digits11+rank_keys+prefetch512" CELLS=8192x64,8192x1024,4096x1024,12288x1024 \
#     PROFILE= bash bench/block_variants_gpu.sh   (the 512 tile prefetching)
#   VARIANTS="spread digits11+rank_keys+prefetch+spread" CELLS=few PROFILE= PATHS=staged FUZZ=60 \
#     TESTS_ON=spread PHASES_OF=spread PHASES_CELLS=16384x1,16384x4,4096x1 bash bench/block_variants_gpu.sh   (the
#     spread path at 1-4 rows against the Triton staged path; about 3 minutes)
#   VARIANTS="tma_ids" CELLS=16384x1024,16384x4096,16384x256,9000x1024,12001x1024 PROFILE= FUZZ=20 \
#     TESTS_ON=tma_ids bash bench/block_variants_gpu.sh   (the filter's ids by bulk copies too, through a ring:
#     session 36's call 1 timed it 1.0-1.08x; filter_tma, the scores by one bulk copy, shipped that session;
#     phases: python3 bench/block_phases.py --kind filter --module $V/NAME.py)
#   VARIANTS="emit_u32 cut_list rank_keys cut_list+emit_u32" CELLS=16384x1024,16384x4096,9000x1024,16384x64 \
#     PROFILE= FUZZ=8 bash bench/block_variants_gpu.sh   (session 36's call 2, count_nan since shipped: emit_u32
#     0.99x, cut_list and rank_keys 1.01-1.04x)
#   (session 37's calls ran block_ab.py and block_phases.py directly, their commands in
#     docs/benchmarks_select_kernel.md: the turns at the load and ids_all shipped; tma_split+ids_all 1.02x and
#     hist4 1.01-1.04x the time, turn4 and turn6 within 1-2 %)
#   (session 38's calls ran block_ab.py directly too: tma_split 1.02-1.10x and cut_list 1.01-1.17x the time,
#     emit_u32 within 1 %, rank_ilp 1.01-1.10x; turn6 0.98-0.99x on random rows, shipped as TURN_NS 6000)
#   (session 39's calls ran block_ab.py directly: on an H100, turn4 1.04x, turn5 1.01x, turn7 1.02x and
#     turn8 1.05x the time of the shipped 6,000 ns at 1024 x 16384 random)
#   VARIANTS="turn5 turn7" CELLS=16384x1024,16384x4096,16384x512,9000x1024 PROFILE= FUZZ=10 \
#     bash bench/block_variants_gpu.sh   (on an H200: the turn's window, tuned on the H100)
#   VARIANTS="lazy_ids lazy_ids+ids_l2 lazy_ids+turn4" CELLS=16384x1024,16384x4096,16384x133,9000x1024 PROFILE= \
#     FUZZ=10 TESTS_ON=lazy_ids bash bench/block_variants_gpu.sh   (session 41's call 1, H100: exact and slower,
#     lazy_ids 1.08x, lazy_ids+ids_l2 1.03x, lazy_ids+turn4 1.06x the time at 1024 x 16384 random)
#   VARIANTS="window" CELLS=16384x1024,16384x4096,16384x133,9000x1024 PROFILE= FUZZ=15 TESTS_ON=window \
#     bash bench/block_variants_gpu.sh   (session 42's variant: the load's first digit counted only in a window
#     found from a sample of the row; its phases: python3 bench/block_phases.py --kind filter --module
#     $V/window.py; count_after's phases split the load from its atomics: --module $V/count_after.py. Session
#     43's call ran block_ab.py directly, on an H200: window exact and 1.14-1.32x the time, 117.3 against 94.5
#     at 1024 x 16384 random; count_after's load 1,168 cycles shorter and its count 2,060 longer)
# Before a call: every variant passes the CPU runner's tests, and nvcc compiles its CUDA side (the runner
# compiles only the #else side of its GPU-only code; session 35's first call stopped at an NVRTC error)
#   python3 -m pytest -q tests/test_select_block_cpu.py --block-module /tmp/v/NAME.py
#   python3 bench/block_registers.py /tmp/v/NAME.py   (nvcc for sm_90, no GPU needed; "FAILED": it does not compile)
set -u
source tools/gpu_env.sh
V=/tmp/block_variants
# (what is left after session 30, each measured slower than the shipped kernel at 16384: a second look)
VARIANTS=${VARIANTS:-"digits11 rank_keys digits11+rank_keys prefetch digits11+rank_keys+prefetch"}
# the goal's cells (k = 2048): Q = 64, 1024 and 4096 at N = 16384, and 1024 rows of 32768
CELLS=${CELLS:-16384x64,16384x1024,16384x4096,32768x1024}
# rows beyond a block (the cells that timed the sampled keep, sessions 26-30): mass ties at 1024 rows of
# 20000-32768, the row kernel's shapes (9 rows and more beyond 32768), the staged path's beyond 16384 (1-4
# rows), rows of 16384 at 1024 and 4096
LONG=20000x1024,32768x1024,32768x64,65536x64,65536x1024,131072x8,131072x64,131072x256,32768x1,131072x1,65536x4
LONG=$LONG,16384x1024,16384x4096
# the variant whose phases are profiled (clock stamps at the phase boundaries; empty: none), and where
# the spread path's cells (bench/block_variants.py: spread): 1-4 rows of one block, the staged path's shapes
FEW=16384x1,16384x2,16384x4,8192x1,4096x1,2048x4
[ "$CELLS" = long ] && CELLS=$LONG
[ "$CELLS" = few ] && CELLS=$FEW
PROFILE=${PROFILE-digits11+rank_keys}  # (bench/block_phases.py launches the row kind itself: not prefetch)
PROFILE_CELLS=${PROFILE_CELLS:-16384x64,16384x1024}
{
  # shellcheck disable=SC2086
  python3 bench/block_variants.py --out "$V" $VARIANTS $PROFILE
  olds=()
  for v in $VARIANTS; do olds+=(--old "$V/$v.py"); done
  echo "=== A/B (old columns: the variants; new: the shipped kernel)"
  timeout "${AB_TIMEOUT:-330}" python3 bench/block_ab.py "${olds[@]}" --cells "$CELLS" --patterns random,ties,short --fuzz-seconds "${FUZZ:-0}" \
    ${FUZZ:+--fuzz-old} ${PATHS:+--paths "$PATHS"} --out "$OUT/variants_ab.json"
  if [ -n "${PHASES_OF:-}" ]; then  # a variant's kernels timed one by one (bench/launch_phases.py)
    echo "=== $PHASES_OF's kernels one by one"
    # shellcheck disable=SC2086
    timeout 60 python3 bench/launch_phases.py --module "$V/$PHASES_OF.py" ${PHASES_SET:+--set "$PHASES_SET"} \
      ${PHASES_CELLS:+--cells "$PHASES_CELLS"} --out "$OUT/launch_phases.json"
  fi
  if [ -n "$PROFILE" ]; then
    echo "=== phases of $PROFILE (bench/block_phases.py)"
    timeout 120 python3 bench/block_phases.py --module "$V/$PROFILE.py" --cells "$PROFILE_CELLS" --patterns random,ties \
      --out "$OUT/variant_phases.json"
  fi
  if [ -n "${TESTS_ON:-}" ]; then  # the block path's GPU tests on a variant (conftest.py's --block-module)
    echo "=== block path GPU tests on $TESTS_ON"
    timeout 90 python3 -m pytest -q -p no:cacheprovider -rf tests/test_select_kernel_gpu.py tests/test_select_block.py \
      -k block --block-module "$V/$TESTS_ON.py" 2>&1 | tail -15
  else
    echo "=== block path GPU tests (shipped kernel)"
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_select_kernel_gpu.py -k block 2>&1 | tail -4
  fi
} 2>&1 | tee "$OUT/log.txt"
