"""What composing a job's config costs, warm, in one process: `compose` + `make_spec` for a few
configs that differ in a value each time (as a sweep's jobs and the test suite's specs do), with its
parts timed. Where kvpipe types each group's chosen option without OmegaConf
(`kvpipe.jobspec.options.plainly_typed`), the same compositions are also run with that shortcut off,
alternating with it on, so their ratio comes from one run.

    python benchmarks/composition.py            # 10 rounds of 6 configs
    python benchmarks/composition.py --rounds 30
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvpipe.jobspec import compose, make_spec, options

CONFIGS = [(), ("cache=quantized",), ("press=knorm",), ("workload=passkey",), ("cache=static",), ("load=rate", "cache=paged")]  # fmt: skip
COMMON = ("model=tiny_random", "tracking=off", "quality=off")


def composed_ms(round_index: int, shortcut: bool) -> tuple[float, float]:
    """(ms per composition, of which typing the options) over every config once."""
    typing_s, typed, plainly = [0.0], options.typed, options.plainly_typed

    def timed_typed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return typed(*args, **kwargs)
        finally:
            typing_s[0] += time.perf_counter() - started

    options.typed = timed_typed
    options.plainly_typed = plainly if shortcut else (lambda option, given: None)
    try:
        started = time.perf_counter()
        for config in CONFIGS:
            overrides = [*COMMON, *config, f"workload.seed={round_index}"]
            make_spec(compose(overrides), overrides)
        total = time.perf_counter() - started
    finally:
        options.typed, options.plainly_typed = typed, plainly
    return total / len(CONFIGS) * 1e3, typing_s[0] / len(CONFIGS) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    for config in CONFIGS:  # cold: every group choice composed once, every module imported
        make_spec(compose([*COMMON, *config]), [*COMMON, *config])
    runs = {True: [], False: []}
    for index in range(args.rounds):
        for shortcut in (True, False) if index % 2 == 0 else (False, True):  # ABBA
            runs[shortcut].append(composed_ms(index, shortcut))
    for shortcut, label in ((False, "OmegaConf types every option"), (True, "plain values typed directly")):
        total = statistics.median(t for t, _ in runs[shortcut])
        typing_ms = statistics.median(t for _, t in runs[shortcut])
        print(f"{label:30s}  {total:6.1f} ms a composition, of which typing the options {typing_ms:5.1f} ms")
    ratios = [a[0] / b[0] for a, b in zip(runs[True], runs[False])]
    print(f"composition time, shortcut / without: {statistics.median(ratios):.2f} (median of {len(ratios)} pairs)")


if __name__ == "__main__":
    main()
