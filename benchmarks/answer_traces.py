"""What logging a job's scored answers as MLflow traces costs: kvpipe's way (kvpipe.record.traces:
each trace and its assessments in one write, its spans as one artifact) against MLflow's documented
one (a span per answer, exported as it ends, then mlflow.log_expectation and mlflow.log_feedback per
verdict), on the same answers, each way in a process of its own (kvpipe's changes how MLflow exports
traces in its process), alternating, into a new SQLite store each time or into one tracking server.
Both ways are read back, and must give the same traces: prompt, answer, tags and assessments.

    python benchmarks/answer_traces.py                         # 30 answers, 3 rounds, SQLite
    python benchmarks/answer_traces.py --answers 100 --rounds 5
    python benchmarks/answer_traces.py --server http://127.0.0.1:5000   # a running tracking server
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WAYS = ("mlflow", "kvpipe")


def answers(n: int):
    from kvpipe.workload import Answer

    return [
        Answer(
            row=i,
            repeat=0,
            prompt=f"What is the pass key? {'text ' * 100}",
            expected=("71432",),
            answer="71432" if i % 3 else "7143",
            score=float(i % 3 > 0),
            correct=i % 3 > 0,
            reference_answer="71432",
            reference_correct=True,
        )  # fmt: skip
        for i in range(n)
    ]


def log_as_mlflow_documents(experiment_id: str, run_id: str, logged: list, scorer: str, cache: str) -> int:
    """MLflow's documented calls, in the order its docs show them."""
    import mlflow
    from mlflow.entities import AssessmentSource

    from kvpipe.record import traces

    judge = AssessmentSource(source_type="CODE", source_id=f"kvpipe.{scorer}")
    of_run = {traces.ASSESSMENT_RUN: run_id}
    for answer in logged:
        span = mlflow.start_span_no_context(
            traces.SPAN_NAME, span_type="LLM", inputs={"prompt": answer.prompt}, experiment_id=experiment_id,
            tags={traces.CACHE_TAG: cache, traces.ROW_TAG: str(answer.row), traces.REPEAT_TAG: str(answer.repeat)},
            metadata={traces.SOURCE_RUN: run_id},
        )  # fmt: skip
        span.end(outputs=answer.answer)
        mlflow.log_expectation(trace_id=span.trace_id, name=traces.EXPECTED, value=answer.expected[0], metadata=of_run)
        for name, value, rationale in traces.verdicts(answer, scorer):
            metadata = {**of_run, "score": answer.score}
            mlflow.log_feedback(trace_id=span.trace_id, name=name, value=value, source=judge, rationale=rationale,
                                metadata=metadata)  # fmt: skip
    return len(logged)


def one_way(way: str, uri: str, n: int) -> None:
    """In its own process: log n answers to a new run, print the seconds it took and what reads back."""
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    import mlflow

    from kvpipe.record import traces

    mlflow.set_tracking_uri(uri)
    experiment_id = mlflow.set_experiment(f"answer-traces-{way}").experiment_id
    log = traces.log_answers if way == "kvpipe" else log_as_mlflow_documents
    with mlflow.start_run(experiment_id=experiment_id) as run:
        log(experiment_id, run.info.run_id, answers(2), "contains", "dynamic")  # MLflow's tracer set up
    with mlflow.start_run(experiment_id=experiment_id) as run:
        started = time.perf_counter()
        log(experiment_id, run.info.run_id, answers(n), "contains", "dynamic")
        seconds = time.perf_counter() - started
        run_id = run.info.run_id
    found = mlflow.search_traces(locations=[experiment_id], run_id=run_id, return_type="list")
    read = sorted(
        (t.data.spans[0].inputs["prompt"], t.data.spans[0].outputs, t.info.tags[traces.ROW_TAG],
         sorted((a.name, str(a.value), a.source.source_type, a.rationale or "") for a in t.info.assessments))
        for t in found
    )  # fmt: skip
    print(json.dumps({"seconds": seconds, "read": read}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", help="a tracking server's URI (default: a new SQLite store each round)")
    parser.add_argument("--one-way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_way:
        return one_way(args.one_way, args.uri, args.answers)
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(args.rounds):
            read = {}
            for way in WAYS if index % 2 == 0 else WAYS[::-1]:
                uri = args.server or f"sqlite:///{scratch}/{way}-{index}.db"
                command = [sys.executable, __file__, "--one-way", way, "--uri", uri, "--answers", str(args.answers)]
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    sys.exit(f"{way} failed:\n{done.stderr[-2000:]}")
                reply = json.loads(done.stdout.strip().splitlines()[-1])
                seconds[way].append(reply["seconds"])
                read[way] = reply["read"]
            if read["kvpipe"] != read["mlflow"]:
                sys.exit("the two ways read back different traces")
            print(f"round {index + 1}: " + ", ".join(f"{way} {seconds[way][-1]:.2f} s" for way in WAYS), flush=True)
    mlflow_s, kvpipe_s = (statistics.median(seconds[way]) for way in WAYS)
    where = args.server or "a new SQLite store"
    print(f"{args.answers} answers into {where}, median of {args.rounds}: MLflow's documented calls {mlflow_s:.2f} s, "
          f"kvpipe's {kvpipe_s:.2f} s ({mlflow_s / kvpipe_s:.1f}x); both read back the same traces")  # fmt: skip


if __name__ == "__main__":
    main()
