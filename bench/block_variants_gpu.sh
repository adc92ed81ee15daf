#!/usr/bin/env bash
# One device call: the block kernel's variants (bench/block_variants.py) against the shipped kernel,
# every cell checked bit for bit; one variant's phases; the block path's GPU tests (TESTS_ON: on a variant). At most 9
# minutes: its steps time out at 330 (AB_TIMEOUT) + 120 + 90 s (+ 60 with PHASES_OF), within the device tool's 600.
#   bash bench/block_variants_gpu.sh   (results in $OUT: variants_ab.json, variant_phases.json, log.txt)
#   TESTS_ON=scan+digits11+rank_keys+prefetch bash bench/block_variants_gpu.sh   (the first call of session 28's plan:
#     the block path's GPU tests on the combination with the prefetch)
#   VARIANTS="sampled_count sampled_fast scan+digits11+rank_keys+sampled_fast" CELLS=20000x1024,32768x1024,65536x64,65536x1024,131072x8,131072x64,131072x256,32768x1 \
#     PROFILE= PATHS=row,staged FUZZ=60 PHASES_OF=sampled_fast PHASES_CELLS=32768x1024,20000x1024,131072x64 \
#     TESTS_ON=sampled_fast bash bench/block_variants_gpu.sh   (the second: the sampled keep with a counted
#     sample and a keep by warps, against the shipped path, fp32 topk and the Triton paths beyond 16384)
#   VARIANTS="prefetch512 scan+digits11+rank_keys+prefetch512" CELLS=8192x64,8192x1024,4096x1024,12288x1024 \
#     PROFILE= bash bench/block_variants_gpu.sh   (the 512 tile prefetching too)
#   CELLS=8192x64,8192x1024,4096x1024,24576x1024 bash bench/block_variants_gpu.sh   (a second call)
#   VARIANTS="scan scan+match" CELLS=16384x1024 bash bench/block_variants_gpu.sh
#   VARIANTS="sampled sampled_rows sampled_rows_tight scan+digits11+smem_keys+rank_keys+sampled_rows" CELLS=long PROFILE= \
#     PATHS=row,staged FUZZ=60 PHASES_OF=sampled_rows PHASES_SET=SAMPLED_ROWS=1 TESTS_ON=sampled AB_TIMEOUT=380 \
#     bash bench/block_variants_gpu.sh
#     (the first call to make: the sampled keep, columns of the Triton row kernel and staged path, 60 s of fuzzing
#     the first variant, sampled_rows' kernels one by one, the block path's GPU tests on sampled; no profile, so
#     the A/B may take 380 s)
#   VARIANTS="spread scan+digits11+rank_keys+sampled_fast+prefetch+spread" CELLS=few PROFILE= PATHS=staged FUZZ=60 \
#     TESTS_ON=spread PHASES_OF=spread PHASES_CELLS=16384x1,16384x4,4096x1 bash bench/block_variants_gpu.sh   (the
#     spread path at 1-4 rows, alone and with everything else, against the Triton staged path; its kernels one by
#     one; about 4 minutes)
# Before a call: every variant passes the CPU runner's tests
#   python3 -m pytest -q tests/test_select_block_cpu.py --block-module /tmp/v/NAME.py
set -u
source tools/gpu_env.sh
V=/tmp/block_variants
# (session 28: the edits not yet timed one by one, the prefetch, and their combinations; smem_keys was timed
# in session 27, slower everywhere)
VARIANTS=${VARIANTS:-"scan match digits11 rank_keys prefetch scan+prefetch scan+digits11+rank_keys scan+digits11+rank_keys+prefetch"}
# the goal's cells (k = 2048): Q = 64, 1024 and 4096 at N = 16384, and rows beyond a block where mass
# ties were slower than fp32 topk (sessions 22-23). A second call: the 512 tile at 64 and 1024 rows
# (lb2_512 was timed at 1024 only), the 256 tile, 24576
CELLS=${CELLS:-16384x64,16384x1024,16384x4096,32768x1024}
# the sampled keep's cells (bench/block_variants.py: sampled, sampled_rows): mass ties at 1024 rows of
# 20000-32768, the row kernel's shapes (9 rows and more beyond 32768), the staged path's beyond 16384 (1-4
# rows), rows of 16384 at 1024 and 4096
LONG=20000x1024,32768x1024,32768x64,65536x64,65536x1024,131072x8,131072x64,131072x256,32768x1,131072x1,65536x4
LONG=$LONG,16384x1024,16384x4096
# the variant whose phases are profiled (clock stamps at the phase boundaries; empty: none), and where
# the spread path's cells (bench/block_variants.py: spread): 1-4 rows of one block, the staged path's shapes
FEW=16384x1,16384x2,16384x4,8192x1,4096x1,2048x4
[ "$CELLS" = long ] && CELLS=$LONG
[ "$CELLS" = few ] && CELLS=$FEW
PROFILE=${PROFILE-scan+digits11+rank_keys}  # (bench/block_phases.py launches the row kind itself: not prefetch)
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
