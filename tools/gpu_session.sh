#!/usr/bin/env bash
# One batched GPU session (device tool): install, GPU tests, benchmarks. Results into $OUT.
#   bash tools/gpu_session.sh            (W = number of visible GPUs)
set -u
OUT=${OUT:-/tmp/tpflare_out}; mkdir -p "$OUT"
W=$(python -c "import torch; print(torch.cuda.device_count())")
log="$OUT/log.txt"
{
  source tools/gpu_env.sh
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
  nvidia-smi topo -m 2>/dev/null | head -5
  echo "=== replay stress W=$W"; timeout ${REPLAY_T:-400} python bench/replay_stress.py --world "$W" --replays 2000 --rows 1024 3072 --json "$OUT/replay.json" 2>&1 | grep -v Warning | tail -8
  echo "=== race W=$W"; timeout ${RACE_T:-300} python bench/race_bench.py --world "$W" --backend nccl --iters 5 --json "$OUT/race.json" 2>&1 | tail -10
  [ -n "${QUICK:-}" ] && exit 0
  # pytest-xdist where installed (the H200 host has it): the selection kernels' GPU tests in
  # about 2 minutes with 8 workers, against more than 5 serially
  xd=$(python -c "import xdist" 2>/dev/null && echo "-n 8")
  echo "=== GPU tests"; timeout 240 python -m pytest -q -p no:cacheprovider $xd tests/test_gpu_capture.py tests/test_select_kernel_gpu.py 2>&1 | tail -15
  echo "=== selection fuzz"; timeout 200 python tools/fuzz_select.py --seconds 120 --out "$OUT/fuzz.json" --save "$OUT/fuzz_cases" 2>&1 | tail -1
  echo "=== GEMM shapes"; timeout 90 python bench/latent_gemm.py --json "$OUT/gemm.json" 2>&1 | tail -6
  echo "=== comm W=$W"; timeout 200 python bench/latent_comm.py --backend nccl --worlds "$W" --json "$OUT/comm.json" 2>&1 | tail -14
  echo "=== compile time W=$W"; timeout 300 python bench/compile_time.py --world "$W" --backend nccl --json "$OUT/compile.json" 2>&1 | tail -6
} > "$log" 2>&1
cat "$log"
