#!/usr/bin/env bash
# Time several commits in one device call: copies of their trees travel with the working tree.
#
#   here:        bash tools/trees.sh prepare main my-branch          # -> _br/main, _br/my-branch
#   device call: run(command="bash tools/trees.sh run main python3 bench/bench_select_kernel.py ... ;
#                             bash tools/trees.sh run my-branch python3 bench/bench_select_kernel.py ...",
#                    carry=["_br"])
#
# `prepare` writes `git archive REF` of each REF into _br/<REF with / as ->, untracked (the
# folder is added to .git/info/exclude, so name it in `carry`). `run NAME CMD...` runs CMD in
# _br/NAME (`.` for the working tree itself) with that tree's tpflare first on PYTHONPATH
# (tools/shim.sh), so no install is needed and
# trees never see each other's code. Keep the copies small: the working tree and the carried
# folders travel, 64 MiB in all.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}; shift || true
case "$cmd" in
  prepare)
    [ $# -ge 1 ] || { echo "usage: $0 prepare REF..." >&2; exit 2; }
    grep -qx '/_br/' "$root/.git/info/exclude" 2>/dev/null || echo '/_br/' >> "$root/.git/info/exclude"
    for ref in "$@"; do
      name=${ref//\//-}; dest="$root/_br/$name"
      git -C "$root" rev-parse --verify -q "$ref^{commit}" >/dev/null || { echo "no such commit: $ref" >&2; exit 2; }
      rm -rf "$dest"; mkdir -p "$dest"
      git -C "$root" archive "$ref" | tar -x -C "$dest"
      echo "_br/$name <- $ref ($(git -C "$root" rev-parse --short "$ref"))"
    done
    du -sh "$root/_br" | awk '{print "_br: " $1 " (travels with carry=[\"_br\"])"}' ;;
  run)
    [ $# -ge 2 ] || { echo "usage: $0 run NAME CMD..." >&2; exit 2; }
    name=$1; shift
    tree=$([ "$name" = . ] && echo "$root" || echo "$root/_br/$name")
    [ -d "$tree/plugin" ] || { echo "no tree at $tree (tools/trees.sh prepare first)" >&2; exit 2; }
    shim=$(bash "$root/tools/shim.sh" "$tree" "$(mktemp -d "${TMPDIR:-/tmp}/tpflare_shim_${name//./root}_XXXX")")
    cd "$tree"
    echo "[trees] $name: $*" >&2
    PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" "$@" ;;
  *)
    echo "usage: $0 prepare REF... | run NAME CMD..." >&2; exit 2 ;;
esac
