"""Passkey retrieval, scored on the measured calls themselves: did each answer hold the exact key?

One row per prompt and measured call (its length, depth, trial, key, answer, whether the key was
found, and the call's timings and KV bytes); cells and lengths aggregate the rows. Pure Python over
the calls: what a cell's accuracy means is defined here once, for result.json, MLflow and plots.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from kvpipe.workload._scored import Answer
from kvpipe.workload.base import until_eos
from kvpipe.workload.passkey.prompts import found


def score(tokenizer, eos_ids: set[int], batches: list, calls: list) -> list[dict]:
    """A row per prompt of every measured call; calls are repeat after repeat over the batches."""
    rows = []
    for index, call in enumerate(calls):
        batch = batches[index % len(batches)]
        for needle, tokens in zip(batch.rows, call.new_tokens.tolist()):
            answer = tokenizer.decode(until_eos(tokens, eos_ids), skip_special_tokens=True).strip()
            rows.append(
                {
                    "context_tokens": needle.context_tokens,
                    "depth": needle.depth,
                    "trial": needle.trial,
                    "repeat": index // len(batches),
                    "key": needle.key,
                    "answer": answer,
                    "found": found(answer, needle.key),
                    "ttft_ms": call.timing.ttft_ms,
                    "tpot_ms": call.timing.tpot_ms,
                    "kv_cache_bytes": call.kv_bytes,
                }
            )
    return rows


def answers(rows: list[dict]) -> list[Answer]:
    """The rows as answers: each expects its key, and is right where it holds it. The prompt, a
    haystack of thousands of tokens, is named by where its key was hidden."""
    numbers: dict[int, int] = defaultdict(int)  # a prompt's number: its place among its repeat's rows
    found = []
    for row in rows:
        repeat, right = row.get("repeat", 0), bool(row["found"])
        prompt = f"the key at depth {row['depth']:.0%} of {row['context_tokens']:,} tokens, trial {row.get('trial', 0)}"
        found.append(Answer(numbers[repeat], repeat, prompt, (str(row["key"]),), row["answer"], float(right), right))
        numbers[repeat] += 1
    return found


def accuracy(rows: list[dict]) -> float:
    return sum(row["found"] for row in rows) / len(rows)


def metrics(rows: list[dict]) -> dict[str, float]:
    """The run's own figures: accuracy over every answer, and how many answers that is."""
    return {"retrieval_accuracy": accuracy(rows), "retrieval_answers": len(rows)}


def cells(rows: list[dict]) -> list[dict]:
    """Per (context length, depth): answers, keys found, accuracy, and that cell's mean timings."""
    return [
        _aggregate(group, context_tokens=length, depth=depth)
        for (length, depth), group in _by(rows, "context_tokens", "depth")
    ]


def lengths(rows: list[dict]) -> list[dict]:
    """Per context length, over every depth: accuracy, timings and KV bytes (what the length costs)."""
    return [_aggregate(group, context_tokens=length) for (length,), group in _by(rows, "context_tokens")]


def _by(rows: list[dict], *keys: str) -> list[tuple[tuple, list[dict]]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[key] for key in keys)].append(row)
    return sorted(groups.items())


def _aggregate(rows: list[dict], **where) -> dict:
    return {
        **where,
        "answers": len(rows),
        "found": sum(row["found"] for row in rows),
        "retrieval_accuracy": accuracy(rows),
        "ttft_ms": statistics.fmean(row["ttft_ms"] for row in rows),
        "tpot_ms": statistics.fmean(row["tpot_ms"] for row in rows),
        "kv_cache_bytes": max(row["kv_cache_bytes"] for row in rows),
    }


def stepped_metrics(rows: list[dict]) -> list[tuple[str, float, int]]:
    """(name, value, step) for MLflow, with the context length as the step: accuracy over all depths
    and at each depth, and the length's TTFT, TPOT and KV bytes."""
    stepped = []
    for length in lengths(rows):
        step = length["context_tokens"]
        stepped.append(("retrieval_accuracy/all_depths", length["retrieval_accuracy"], step))
        for name in ("ttft_ms", "tpot_ms", "kv_cache_bytes"):
            stepped.append((f"{name}/by_length", length[name], step))
    for cell in cells(rows):
        stepped.append((depth_metric(cell["depth"]), cell["retrieval_accuracy"], cell["context_tokens"]))
    return stepped


DEPTH_PREFIX = "retrieval_accuracy/depth_"


def depth_metric(depth: float) -> str:
    """The MLflow metric of one depth's accuracy, stepped by context length: retrieval_accuracy/depth_0.5."""
    return f"{DEPTH_PREFIX}{depth:g}"
