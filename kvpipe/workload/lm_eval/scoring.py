"""Generated answers scored by lm-eval itself, as its evaluator does: each text cut at the task's
stop sequences (as lm-eval's HF model cuts it), put in the request's `resps`, the task's filters
applied, `process_results` per document, and each metric aggregated by the task's own aggregation.

A row per answer keeps what result.json needs to score it again: the per-document value of every
(metric, filter) and `score`, the task's quality metric under its first filter (tasks.quality_metric).
"""

from __future__ import annotations

import math
import numbers

from kvpipe.workload.lm_eval.tasks import Request, quality_metric


def cut(text: str, until: tuple[str, ...]) -> str:
    """The answer before the first of the task's stop sequences (lm-eval's postprocess_generated_text)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


def answer_rows(tasks: dict, requests: list[Request], texts: list[str], repeat: int = 0) -> list[dict]:
    """A row per request, its generated text (before end-of-sequence) scored through its task."""
    for request, text in zip(requests, texts):
        request.instance.resps = [cut(text, request.until)]
    rows = []
    for name, task in tasks.items():
        own = [r for r in requests if r.task == name]
        # task.apply_filters() filters the instances the task built last, which another job of the
        # same task (sharing the loaded task) may have rebuilt: filter this job's own, as it does
        for ensemble in getattr(task, "_filters", ()) if own else ():
            ensemble.apply([r.instance for r in own])
        quality = quality_metric(task)
        rows += [_row(task, request, quality, repeat) for request in own]
    return rows


def _row(task, request: Request, quality: str, repeat: int) -> dict:
    instance = request.instance
    filters = list(instance.filtered_resps)
    values = {}
    for key in filters:
        for metric, value in task.process_results(instance.doc, [instance.filtered_resps[key]]).items():
            values[f"{metric},{key}"] = _plain(value)
    return {
        "task": request.task,
        "doc_id": instance.doc_id,
        "repeat": repeat,
        "prompt": request.context,
        "expected": str(task.doc_to_target(instance.doc)),
        "answer": instance.resps[0],
        "filtered": str(instance.filtered_resps[filters[0]]),
        "metrics": values,
        "score": float(values[f"{quality},{filters[0]}"]),
    }


def _plain(value):
    """A metric's per-document value as JSON keeps it (numpy numbers as floats, tuples as lists)."""
    if isinstance(value, numbers.Number):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def task_figures(tasks: dict, rows: list[dict]) -> list[dict]:
    """Each task's metrics under each filter, aggregated as the task aggregates them, with lm-eval's
    closed-form standard error of a mean (its bootstrapped ones, for bleu or a median, run in a
    process pool: left out, as None)."""
    from lm_eval.api.metrics import mean, mean_stderr

    figures = []
    for name, task in tasks.items():
        own = [row for row in rows if row["task"] == name]
        keys = list(own[0]["metrics"]) if own else []
        for key in keys:
            metric, _, filter_name = key.partition(",")
            items = [row["metrics"][key] for row in own]
            aggregate = task.aggregation().get(metric, mean)
            stderr = mean_stderr(items) if aggregate is mean and len(items) > 1 else None
            value = float(aggregate(items))
            figures.append({"task": name, "metric": metric, "filter": filter_name, "value": value,
                            "stderr": None if stderr is None or math.isnan(stderr) else float(stderr),
                            "documents": len(items)})  # fmt: skip
    return figures
