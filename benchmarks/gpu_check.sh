#!/usr/bin/env bash
# The GPU check as one command: bash benchmarks/gpu_check.sh [--reduced] [--out DIR] [--model NAME]
# Runs benchmarks/gpu_check.py with the repo's venv when present; the exit status is the check's.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # kvpipe from this checkout, even where it is not installed
PYTHON=python3
if [[ -x "$REPO/.venv/bin/python" ]]; then
  PYTHON="$REPO/.venv/bin/python"
  # The venv's ninja first: quanto rebuilds its extension whenever another ninja touched it (see Makefile).
  export PATH="$REPO/.venv/bin:$PATH"
fi
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
