"""Each scored answer (kvpipe.workload.Answer) as an MLflow trace of the job's run, so MLflow 3's
GenAI views list every prompt with its answer and verdict, and a trace search by cache and
`flipped` finds the prompts a cache broke: inputs the prompt, outputs the answer, the expected answer(s) as an
expectation, and as feedback from kvpipe's own code (the workload's scorer) `correct` and, where the
quality pass ran, `reference_answer` and `flipped`. Tagged with the cache, row and repeat, for the
UI's filters.

Spans are made directly rather than through mlflow.genai.evaluate: evaluate took 33 s for 30
answers on a 2-core machine's SQLite store (its 10 threads wait on the store's connection pool), 3.3 s
with one thread, and adds a metric and a dataset input to the run; the same calls made directly
took 2.2 s, and 0.75 s since each trace is one write (docs/workloads.md has the measurements).
"""

from __future__ import annotations

import logging
import os

from kvpipe.workload import Answer

log = logging.getLogger(__name__)

SPAN_NAME = "answer"
EXPECTED = "expected_response"  # the expectation MLflow's own scorers read as the right answer
CORRECT, REFERENCE_ANSWER, FLIPPED = "correct", "reference_answer", "flipped"
CACHE_TAG, ROW_TAG, REPEAT_TAG = "kvpipe.cache", "kvpipe.row", "kvpipe.repeat"
SOURCE_RUN = "mlflow.sourceRun"  # a trace's link to its run: the run page's Traces tab lists it
ASSESSMENT_RUN = "mlflow.assessment.sourceRunId"  # as mlflow.genai.evaluate marks its assessments
# Says at INFO, as the process exits, that it flushes its queue: here flushed already, so not news
EXPORT_QUEUE_LOGGER = "mlflow.tracing.export.async_export_queue"
ASYNC_TRACES = "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"


def log_answers(experiment_id: str, run_id: str, answers: list[Answer], scorer: str, cache: str) -> int:
    """A trace per answer in the run's experiment, linked to the run; how many were logged. A
    failure is one warning: the run, already whole, is kept."""
    if not answers:
        return 0
    try:
        return _log_answers(experiment_id, run_id, answers, scorer, cache)
    except Exception as exc:  # noqa: BLE001 — the traces are a view of result.json, which MLflow has already
        log.warning("the run's answers were not logged as MLflow traces (%s: %s); result.json holds them",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")  # fmt: skip
        return 0


def _log_answers(experiment_id: str, run_id: str, answers: list[Answer], scorer: str, cache: str) -> int:
    # Each trace written as its span ends, not by MLflow's export threads: the flush below waits for
    # their queue's one-second poll (1.5 s for 10 answers against 0.65 s written directly, 2-core VM).
    # Read where MLflow first sets up its tracer, which in kvpipe is here; a user's own setting stands.
    os.environ.setdefault(ASYNC_TRACES, "false")
    import mlflow
    from mlflow.entities import AssessmentSource, Expectation, Feedback

    logging.getLogger(EXPORT_QUEUE_LOGGER).setLevel(logging.WARNING)
    judge = AssessmentSource(source_type="CODE", source_id=f"kvpipe.{scorer}")
    of_run = {ASSESSMENT_RUN: run_id}
    for answer in answers:
        span = mlflow.start_span_no_context(
            SPAN_NAME,
            span_type="LLM",
            inputs={"prompt": answer.prompt},
            experiment_id=experiment_id,
            tags={CACHE_TAG: cache, ROW_TAG: str(answer.row), REPEAT_TAG: str(answer.repeat)},
            metadata={SOURCE_RUN: run_id},
        )
        expected = answer.expected[0] if len(answer.expected) == 1 else list(answer.expected)
        # as MLflow writes an expectation by default: a person's (the labelled file's author's)
        judged = [Expectation(name=EXPECTED, value=expected, metadata=of_run)]
        scored = {**of_run, "score": answer.score}
        judged += [
            Feedback(name=name, value=value, source=judge, rationale=rationale, metadata=scored)
            for name, value, rationale in verdicts(answer, scorer)
        ]
        _one_write_per_trace()
        with _open_trace(span.trace_id) as trace:
            trace.info.assessments.extend(judged)  # written with the trace, in its one transaction
        span.end(outputs=answer.answer)
    mlflow.flush_trace_async_logging()  # where the user turned asynchronous logging back on
    return len(answers)


def _open_trace(trace_id: str):
    """The trace MLflow holds in memory until its root span ends, under MLflow's lock."""
    from mlflow.tracing.trace_manager import InMemoryTraceManager

    return InMemoryTraceManager.get_instance().get_trace(trace_id)


def _one_write_per_trace() -> None:
    """A trace and its assessments written in one transaction, its spans as one artifact file, as
    MLflow writes them to a store that cannot log spans one by one. Where a store can, MLflow's
    exporter writes each span as it ends, then the trace, whose row then exists already: MLflow
    rereads it and merges every tag and metadata row, and each assessment logged afterwards is one
    more write: 1.91 s for 30 answers into SQLite, against 0.75 s here (benchmarks/answer_traces.py,
    docs/workloads.md). What MLflow's views and trace search read back is the same."""
    from mlflow.tracing.provider import _get_trace_exporter

    exporter = _get_trace_exporter()
    if getattr(exporter, "_store_supports_log_spans", None):
        exporter._store_supports_log_spans = False


def verdicts(answer: Answer, scorer: str) -> list[tuple[str, object, str | None]]:
    """(name, value, rationale) of each feedback kvpipe's code gives an answer."""
    expected = ", ".join(map(repr, answer.expected))
    found = [(CORRECT, answer.correct, f"{scorer} scored it {answer.score:.2f} against {expected}")]
    if answer.flipped is not None:
        was = "right" if answer.reference_correct else "wrong"
        found.append((REFERENCE_ANSWER, answer.reference_answer, f"a full-precision DynamicCache's answer ({was})"))
        found.append((FLIPPED, answer.flipped.value, None))
    return found
