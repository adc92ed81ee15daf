#!/usr/bin/env bash
# One device call (about 5-8 minutes on an H200): the block kernel's variants (bench/block_variants.py)
# against the shipped kernel, every cell checked bit for bit, then the block path's GPU tests.
#   bash bench/block_variants_gpu.sh                 (results in $OUT: variants_ab.json, log.txt)
#   CELLS=8192x64,8192x1024,4096x1024,24576x1024 bash bench/block_variants_gpu.sh   (a second call)
#   VARIANTS="scan scan+match" CELLS=16384x1024 bash bench/block_variants_gpu.sh
# Before a call: every variant passes the CPU runner's tests
#   python3 -m pytest -q tests/test_select_block_cpu.py --block-module /tmp/v/NAME.py
set -u
source tools/gpu_env.sh
V=/tmp/block_variants
VARIANTS=${VARIANTS:-"scan match peel scan+match smem_keys scan+smem_keys scan+match+smem_keys lb2_512"}
# the goal's cells (k = 2048): Q = 64, 1024 and 4096 at N = 16384, and rows beyond a block where mass
# ties were slower than fp32 topk (sessions 22-23). A second call: the 512 tile at 64 and 1024 rows
# (lb2_512 was timed at 1024 only), the 256 tile, 24576
CELLS=${CELLS:-16384x64,16384x1024,16384x4096,32768x1024}
{
  # shellcheck disable=SC2086
  python3 bench/block_variants.py --out "$V" $VARIANTS
  olds=()
  for v in $VARIANTS; do olds+=(--old "$V/$v.py"); done
  echo "=== A/B (old columns: the variants; new: the shipped kernel)"
  timeout 500 python3 bench/block_ab.py "${olds[@]}" --cells "$CELLS" --patterns random,ties,short --fuzz-seconds 0 \
    --out "$OUT/variants_ab.json"
  echo "=== block path GPU tests (shipped kernel)"
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_select_kernel_gpu.py -k block 2>&1 | tail -4
} 2>&1 | tee "$OUT/log.txt"
