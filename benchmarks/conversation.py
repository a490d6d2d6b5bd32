"""Conversations whose every turn re-sends the history: what sharing or keeping the prefix saves.

workload=conversation (bundled sessions: questions about passages of Python's documentation, a shared
system prompt), a few sessions in flight under load=concurrency, each turn a think time after the
previous answer. Four configurations, prepared one by one and then measured in shared rounds in a
shuffled order (kvpipe.job.runner.measured_together), so a busy machine slows them alike:

- cache=paged with cache.allow_block_sharing=true (transformers' prefix match over the pool's blocks)
  and =false;
- cache=dynamic recomputing every turn's history (the baseline), and with
  workload.keep_session_cache=true (each session's cache kept between its turns).

Per configuration: the prefix hit rate (prompt tokens served from cache over prompt tokens), TTFT
p50/p90 over every turn and p50 of first and of later turns, the KV bytes its requests held at peak
in flight (paged: the pool's blocks; dynamic: its largest call's cache) and the bytes kept sessions
held while their users thought; the queueing (a turn's wait for the server, inside its TTFT) and
whether the machine was contended while it ran.

    OMP_NUM_THREADS=2 python benchmarks/conversation.py                         # embedded model
    OMP_NUM_THREADS=1 python benchmarks/conversation.py --threads 1 --model tiny_random --rounds 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvpipe.job.runner import measured_together
from kvpipe.jobspec import spec_from
from kvpipe.units import human_bytes

CONFIGURATIONS = {
    "paged, block sharing": ["cache=paged", "cache.allow_block_sharing=true"],
    "paged, no sharing": ["cache=paged", "cache.allow_block_sharing=false"],
    "dynamic, recomputed": ["cache=dynamic"],
    "dynamic, kept session caches": ["cache=dynamic", "workload.keep_session_cache=true"],
}
COLUMNS = ("configuration", "prefix hit rate", "TTFT p50 ms", "TTFT p90 ms", "first turns p50 ms",
           "later turns p50 ms", "queueing p50 ms", "KV in flight, peak", "KV kept while thinking, peak",
           "contended")  # fmt: skip


def overrides(args, configuration: list[str]) -> list[str]:
    return [
        f"model={args.model}", f"model.threads={args.threads}", "workload=conversation",
        f"workload.sessions={args.sessions}", f"workload.turns={args.turns}",
        f"workload.think_time_s={args.think_time_s}", f"workload.max_new_tokens={args.max_new_tokens}",
        f"workload.repeats={args.rounds}", "load=concurrency", f"load.concurrency={args.concurrency}",
        "quality=off", "tracking=off", *configuration,
    ]  # fmt: skip


def row(label: str, result) -> list[str]:
    metrics = result.metrics
    in_flight = metrics.get("kv_held_bytes", metrics["kv_cache_bytes"])
    hit_rate = metrics.get("prefix_hit_rate", 0.0)  # recomputing: nothing served from a cache
    return [
        label, f"{hit_rate:.0%}", f"{metrics['ttft_p50_ms']:.0f}", f"{metrics['ttft_p90_ms']:.0f}",
        f"{metrics['ttft_first_turn_p50_ms']:.0f}", f"{metrics['ttft_later_turns_p50_ms']:.0f}",
        f"{metrics['queue_p50_ms']:.0f}", human_bytes(in_flight), human_bytes(metrics.get("session_kv_held_bytes", 0.0)),
        result.tags["contended"],
    ]  # fmt: skip


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join([*lines, *("| " + " | ".join(cells) + " |" for cells in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--think-time-s", type=float, default=0.5)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/conversation"))
    args = parser.parse_args()
    specs = [(label, spec_from(overrides(args, configuration))) for label, configuration in CONFIGURATIONS.items()]
    jobs = measured_together(specs, on_prepared=lambda label: print(f"prepared {label}", flush=True))
    rows = [row(job.label, job.result({})) for job in jobs]
    text = markdown(rows) + (
        f"\n\n{args.sessions} sessions of {args.turns} turns, {args.concurrency} in flight, "
        f"{args.think_time_s:g} s think time, {args.max_new_tokens} new tokens a turn, {args.rounds} rounds, "
        f"model={args.model}, model.threads={args.threads}\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conversation.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
