#!/usr/bin/env bash
# The GPU check as one command: bash benchmarks/gpu_check.sh [--reduced] [--out DIR] [--model NAME]
# Runs benchmarks/gpu_check.py with $PYTHON (default: python3 on PATH, e.g. an activated venv's);
# the exit status is the check's.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # kvpipe from this checkout, even where it is not installed
PYTHON="${PYTHON:-python3}"
# That interpreter's scripts folder (its venv's bin) first, for its ninja: quanto rebuilds its extension
# whenever another ninja touched it (see Makefile).
PATH="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH
OUT=outputs/gpu_check  # gpu_check.py's default, relative to where you run this
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --out) OUT="${args[i + 1]:-$OUT}" ;;
    --out=*) OUT="${args[i]#--out=}" ;;
  esac
done
status=0
"$PYTHON" "$REPO/benchmarks/gpu_check.py" "$@" || status=$?
if ((status <= 1)) && [[ -f "$OUT/gpu_check.md" ]]; then  # 2 is a usage error: no report
  echo "reports: $OUT/gpu_check.md and $OUT/gpu_check.json"
fi
exit "$status"
