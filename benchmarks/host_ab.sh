#!/usr/bin/env bash
# The host time of the fused ops' calls, before and after a change, in alternating runs of
# benchmarks/op_host.py on the same machine (host times vary 2x between runs there).
#
#   benchmarks/host_ab.sh OLD_TREE [RANKS] [ROUNDS]
#
# OLD_TREE: a directory holding the package to compare with, as `OLD_TREE/syncopate` (e.g. made with
# `git archive REV syncopate | tar -x -C OLD_TREE`); the working tree's package is "new". Each round
# runs op_host.py with RANKS ranks (default 1) once with each, old first; ROUNDS rounds (default 3).
# Prints op_host.py's lines, each headed "old" or "new".
set -euo pipefail
old="$(cd "${1:?give the directory holding the package to compare with}" && pwd)"
ranks="${2:-1}"
rounds="${3:-3}"
[ -d "$old/syncopate" ] || { echo "host_ab: $old has no syncopate/ package" >&2; exit 2; }
cd "$(dirname "$0")/.."
for _ in $(seq "$rounds"); do
    for v in old new; do
        if [ "$v" = old ]; then path="$old:$PWD"; else path="$PWD"; fi
        PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/op_host.py --ranks "$ranks" 2>&1 \
            | grep host_us | sed "s/^/$v /"
    done
done
