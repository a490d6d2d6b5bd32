"""RULER's scoring (its scripts/eval/synthetic/constants.py and evaluate.py), on the measured calls.

An answer is the text the model wrote before end-of-sequence, stripped, control characters made
newlines (RULER's postprocess_pred). `all` (string_match_all): the share of the expected strings
found in it, case-insensitive; `part` (string_match_part): 1 where any is. A task's accuracy is
the mean over its samples; the suite's (`ruler_accuracy`) the mean over tasks, as RULER averages.

Intervals: Wilson's score interval on the summed scores. A score in 0..1 with mean p has variance at
most p(1 - p), the Bernoulli case's, so Wilson's bound holds for partial scores too (and is sound at
0 and 1, where a t interval of identical scores collapses to a point). Every task has the same count
of samples, so the suite's mean is the mean of every sample's score, and Wilson's interval over all
of them is at least as wide as the stratified one (the mean of p_t(1 - p_t) is at most p(1 - p)).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict

from kvpipe.workload.base import until_eos
from kvpipe.workload.dataset.scoring import wilson

_CONTROL = re.compile(r"[\x00-\x1f]")


def string_match_all(answer: str, expected: list[str]) -> float:
    return sum(e.lower() in answer.lower() for e in expected) / len(expected)


def string_match_part(answer: str, expected: list[str]) -> float:
    return float(any(e.lower() in answer.lower() for e in expected))


MATCHES = {"all": string_match_all, "part": string_match_part}


def answer_text(tokenizer, tokens: list[int], eos_ids: set[int]) -> str:
    text = tokenizer.decode(until_eos(tokens, eos_ids), skip_special_tokens=True).strip()
    return _CONTROL.sub("\n", text).strip()


def score(tokenizer, eos_ids: set[int], batches: list, calls: list, matches: dict[str, str]) -> list[dict]:
    """A row per prompt of every measured call (calls are repeat after repeat over the batches);
    `matches`: each task's way of scoring (all | part)."""
    rows = []
    for index, call in enumerate(calls):
        batch = batches[index % len(batches)]
        for prompt, tokens in zip(batch.rows, call.new_tokens.tolist()):
            answer = answer_text(tokenizer, tokens, eos_ids)
            rows.append(
                {
                    "task": prompt.task,
                    "context_tokens": prompt.context_tokens,
                    "sample": prompt.sample,
                    "repeat": index // len(batches),
                    "question": prompt.question,
                    "expected": list(prompt.expected),
                    "answer": answer,
                    "score": MATCHES[matches[prompt.task]](answer, list(prompt.expected)),
                    "ttft_ms": call.timing.ttft_ms,
                    "tpot_ms": call.timing.tpot_ms,
                    "kv_cache_bytes": call.kv_bytes,
                }
            )
    return rows


def accuracy(rows: list[dict]) -> tuple[float, float, float]:
    """(mean score, its 95% interval's low and high ends)."""
    total = sum(row["score"] for row in rows)
    low, high = wilson(total, len(rows))
    return total / len(rows), low, high


def by(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[key] for key in keys)].append(row)
    return dict(sorted(groups.items()))


def figures(rows: list[dict]) -> dict[str, float]:
    """The suite's accuracy with its interval, each task's, and how many answers were scored."""
    tasks = by(rows, "task")
    values = {"ruler_answers": float(len(rows))}
    for (task,), group in tasks.items():
        values.update(zip(task_metrics(task), accuracy(group)))
    mean, low, high = accuracy(rows)  # equal samples per task: the mean of the tasks' means
    if len({len(group) for group in tasks.values()}) > 1:  # not so (some answers missing): average tasks
        mean = statistics.fmean(values[task_metrics(task)[0]] for (task,) in tasks)
    values.update(ruler_accuracy=mean, ruler_accuracy_ci_low=low, ruler_accuracy_ci_high=high)
    return values


def task_metrics(task: str) -> tuple[str, str, str]:
    """A task's accuracy metric and its interval's ends: ruler_niah_single_1_accuracy, ..._ci_low, _ci_high."""
    name = f"ruler_{task}_accuracy"
    return name, f"{name}_ci_low", f"{name}_ci_high"


TASK_SERIES = "ruler_accuracy/task_"


def cells(rows: list[dict]) -> list[dict]:
    """Per (task, context length): answers, summed score and accuracy (the heatmap's squares)."""
    return [
        {"task": task, "context_tokens": length, "answers": len(group),
         "score": sum(row["score"] for row in group), "accuracy": accuracy(group)[0]}
        for (task, length), group in by(rows, "task", "context_tokens").items()
    ]  # fmt: skip


def stepped_metrics(rows: list[dict]) -> list[tuple[str, float, int]]:
    """(name, value, step) with the context length as the step: the suite's accuracy (the mean over
    tasks), each task's, and the length's TTFT, TPOT and KV bytes."""
    stepped = []
    for (length,), group in by(rows, "context_tokens").items():
        per_task = [accuracy(task_rows)[0] for task_rows in by(group, "task").values()]
        stepped.append(("ruler_accuracy/all_tasks", statistics.fmean(per_task), length))
        stepped.append(("ttft_ms/by_length", statistics.fmean(row["ttft_ms"] for row in group), length))
        stepped.append(("tpot_ms/by_length", statistics.fmean(row["tpot_ms"] for row in group), length))
        stepped.append(("kv_cache_bytes/by_length", max(row["kv_cache_bytes"] for row in group), length))
    for cell in cells(rows):
        stepped.append((f"{TASK_SERIES}{cell['task']}", cell["accuracy"], cell["context_tokens"]))
    return stepped
