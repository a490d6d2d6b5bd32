#!/usr/bin/env bash
# The GPU check, as one command: bash benchmarks/gpu_check.sh [--reduced] [--out DIR] [--model NAME]
# Runs benchmarks/gpu_check.py with the repo's venv when present; exit status is the check's.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PYTHON=python3
if [[ -x .venv/bin/python ]]; then
  PYTHON=.venv/bin/python
  # The venv's ninja first: quanto rebuilds its extension whenever another ninja touched it (see Makefile).
  export PATH="$PWD/.venv/bin:$PATH"
fi
OUT=outputs/gpu_check
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --out) OUT="${args[i + 1]:-$OUT}" ;;
    --out=*) OUT="${args[i]#--out=}" ;;
  esac
done
status=0
"$PYTHON" benchmarks/gpu_check.py "$@" || status=$?
echo "reports: $OUT/gpu_check.md and $OUT/gpu_check.json"
exit "$status"
