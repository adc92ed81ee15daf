#!/usr/bin/env bash
# A symlink shim that makes the tree TREE importable as `tpflare` without an install:
#   bash tools/shim.sh TREE DIR     -> DIR/tpflare/{plugin/*.py, ops, passes, cache}; prints DIR
# Put DIR first on PYTHONPATH. Used by tools/gpu_env.sh (no pip install possible) and
# tools/trees.sh (one tree per commit).
set -euo pipefail
tree=$(cd "$1" && pwd); dir=$2
rm -rf "$dir/tpflare"; mkdir -p "$dir/tpflare"
for f in "$tree"/plugin/*.py; do ln -s "$f" "$dir/tpflare/"; done
for d in ops passes cache; do ln -s "$tree/$d" "$dir/tpflare/$d"; done
echo "$dir"
