#!/usr/bin/env bash
# CI on a busy machine: .ci/run (make venv, lint, docs, the whole suite) from a fresh clone of this
# repository, N times with the machine to itself and N times beside SPINNERS processes at nice 19 that
# each keep a core busy (a background program, as a user's machine has), taking turns: idle, busy,
# idle, busy... Prints each run's verdict and wall time as a table; a failed run keeps its clone and
# log, named in the table. Exits 1 if any run failed.
#
#   bash benchmarks/ci_under_load.sh [--runs N] [--spinners K] [--only idle|busy] [--reuse-clone]
#
# --runs N       runs of each kind (default 3)
# --spinners K   busy processes beside a busy run (default 1: one core kept busy)
# --only KIND    only idle or only busy runs
# --reuse-clone  clone once and run .ci/run in that clone each time (its venv made by the first run)
#                instead of a fresh clone (and a fresh venv) for every run
# What a clone shares with the others whatever the flags: the per-user caches (pip's, kvpipe's converted
# model, the llama-server `make engines` builds and the suite's torch inductor cache, in ~/.cache/kvpipe):
# remove ~/.cache/kvpipe/engines first to count the build in the first run, ~/.cache/kvpipe/inductor-tests
# to count the tests' first compiles.
set -euo pipefail

RUNS=3
SPINNERS=1
ONLY=""
REUSE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --spinners) SPINNERS="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --reuse-clone) REUSE=1; shift ;;
        *) echo "ci_under_load.sh: unknown argument $1 (expected --runs N, --spinners K, --only idle|busy, --reuse-clone)" >&2; exit 2 ;;
    esac
done
case "$ONLY" in "" | idle | busy) ;; *) echo "ci_under_load.sh: --only $ONLY: expected idle or busy" >&2; exit 2 ;; esac

REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kvpipe-ci-under-load.XXXXXX")"
SPINNER_PIDS=()

stop_spinners() {
    for pid in "${SPINNER_PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    SPINNER_PIDS=()
}
trap stop_spinners EXIT

start_spinners() {
    for _ in $(seq "$SPINNERS"); do
        nice -n 19 sh -c 'while :; do :; done' &
        SPINNER_PIDS+=("$!")
    done
}

kinds=()
for _ in $(seq "$RUNS"); do
    [ "$ONLY" = busy ] || kinds+=(idle)
    [ "$ONLY" = idle ] || kinds+=(busy)
done

echo "CI under load: ${#kinds[@]} runs of .ci/run from clones of $REPO (commit $(git -C "$REPO" rev-parse --short HEAD)), in $WORK"
rows=()
failed=0
for number in "${!kinds[@]}"; do
    kind="${kinds[$number]}"
    clone="$WORK/run-$((number + 1))"
    [ "$REUSE" = 1 ] && clone="$WORK/clone"
    [ -d "$clone" ] || git clone -q "$REPO" "$clone"
    log="$WORK/run-$((number + 1)).log"
    [ "$kind" = busy ] && start_spinners
    echo "run $((number + 1))/${#kinds[@]}: $kind$([ "$kind" = busy ] && echo " (beside $SPINNERS spinning process(es) at nice 19)")..."
    started=$(date +%s)
    if (cd "$clone" && bash .ci/run) >"$log" 2>&1; then verdict=pass; else verdict=FAIL; failed=1; fi
    wall=$(($(date +%s) - started))
    load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?")
    stop_spinners
    summary=$(grep -E "^[0-9]+ (passed|failed)" "$log" | tail -n 2 | tr "\n" " " || true)
    if [ "$verdict" = pass ]; then
        [ "$REUSE" = 1 ] || rm -rf "$clone"
        rm -f "$log"
        log="-"
    fi
    rows+=("| $((number + 1)) | $kind | $verdict | $((wall / 60)) min $((wall % 60)) s | $load | ${summary:-} | $log |")
    echo "  $verdict in $((wall / 60)) min $((wall % 60)) s"
done

echo
echo "| run | machine | .ci/run | wall time | load average at its end | pytest's last lines | log (failed runs) |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
[ "$failed" = 0 ] && [ "$REUSE" = 0 ] && rm -rf "$WORK"
exit "$failed"
