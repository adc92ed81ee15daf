# Source on the GPU machine (device tool): installs tpflare (or a symlink shim) and sets env.
#   source tools/gpu_env.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tpflare_out}; mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --break-system-packages -e . >/dev/null 2>&1 \
  || python3 -m pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1
if ! python3 -c "import tpflare" 2>/dev/null; then   # no pip install possible: a symlink shim
  export PYTHONPATH=$(bash tools/shim.sh "$PWD" /tmp/tpflare_shim)${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import tpflare, torch, triton; print('tpflare from', tpflare.__file__, 'torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
