"""A labelled file: each row's expected answer (or a list of accepted ones), checked when the file
is read, and the job's answers scored against them (`scoring.py`): a row per answer, the mean score
as task_accuracy and its 95% interval; where the quality pass ran, each answer beside the
reference's (a full-precision DynamicCache) to the same prompt: how many changed, and flipped, and
how long the answers ran against the reference's. Pure Python."""

from __future__ import annotations

from kvpipe.errors import ConfigError
from kvpipe.workload._scored import Answer
from kvpipe.workload.base import until_eos
from kvpipe.workload.dataset import scoring

DEFAULT_ANSWER_FIELD = "answer"
RIGHT = 0.5  # a score that counts as right when answers flip (f1's scores lie between 0 and 1)


def answer_column(columns: list[str], answer_field: str | None) -> str | None:
    """The answer column: workload.answer_field, else `answer` where the file has one, else None."""
    if answer_field is None:
        return DEFAULT_ANSWER_FIELD if DEFAULT_ANSWER_FIELD in columns else None
    if answer_field not in columns:
        raise ConfigError(
            "workload.answer_field", answer_field, "no such column; expected one of: " + ", ".join(columns)
        )
    return answer_field


def accepted(path: str, field: str, number: int, value, scorer: scoring.Scorer) -> tuple[str, ...]:
    """A row's accepted answers as texts (a number is its text), each usable by the scorer; `number`
    names the row in errors, counted as an editor counts (from 1)."""
    values = value if isinstance(value, list) else [value]
    texts = tuple(str(v).strip() for v in values if v is not None and not isinstance(v, (dict, list)))
    if not texts or len(texts) != len(values) or not all(texts):
        raise ConfigError(
            "workload.path",
            path,
            f"row {number} has no usable answer in column {field!r} ({value!r}); "
            "expected a text or number, or a list of accepted ones",
        )
    for text in texts:
        why = scorer.unusable(text)
        if why:
            raise ConfigError(
                "workload.path", path, f"row {number}'s answer {text!r} {why} (workload.scorer={scorer.name})"
            )
    return texts


def answer_rows(tokenizer, eos_ids: set[int], batches: list, calls: list, scorer: scoring.Scorer, every_repeat: bool):
    """A row per prompt's answer (the text before its EOS), scored: of the first repeat only where
    every repeat writes the same greedy answers (counting them again would narrow the interval)."""
    rows = []
    for index, call in enumerate(calls):
        repeat = index // len(batches)
        if repeat and not every_repeat:
            break
        for row, tokens in zip(batches[index % len(batches)].rows, call.new_tokens.tolist()):
            answer = answer_text(tokenizer, tokens, eos_ids)
            rows.append(
                {
                    "row": row.number,
                    "repeat": repeat,
                    "prompt": str(row.messages[-1]["content"]),
                    "expected": list(row.answers),
                    "answer": answer,
                    "answer_tokens": len(until_eos(tokens, eos_ids)),
                    "score": scorer.best(answer, list(row.answers)),
                }
            )
    return rows


def answer_text(tokenizer, tokens: list[int], eos_ids: set[int]) -> str:
    return tokenizer.decode(until_eos(tokens, eos_ids), skip_special_tokens=True).strip()


def with_reference(
    rows: list[dict], reference: dict[int, str], scorer: scoring.Scorer, reference_tokens: dict[int, int] | None = None
) -> list[dict]:
    """Each row with the reference's answer to its prompt (by row number), that answer's score and,
    where given, its length in tokens before its EOS."""
    return [
        {**row, "reference_answer": reference[row["row"]], "reference_score": scorer.best(reference[row["row"]], row["expected"]),
         **({"reference_tokens": reference_tokens[row["row"]]} if reference_tokens is not None else {})}
        for row in rows
    ]  # fmt: skip


def figures(rows: list[dict], scorer: scoring.Scorer) -> dict[str, float]:
    """task_accuracy (the mean score), its 95% interval, and how many answers it counts; beside the
    reference's answers, the share that changed, how many flipped either way, and the length ratio."""
    scores = [row["score"] for row in rows]
    low, high = scoring.interval(scorer, scores)
    found = {
        "task_accuracy": sum(scores) / len(scores),
        "task_accuracy_ci_low": low,
        "task_accuracy_ci_high": high,
        "task_answers": len(scores),
    }
    if all("reference_answer" in row for row in rows):
        flips = [(row["reference_score"] >= RIGHT, row["score"] >= RIGHT) for row in rows]
        found["answers_changed"] = sum(row["answer"] != row["reference_answer"] for row in rows) / len(rows)
        found["flipped_to_wrong"] = sum(was and not now for was, now in flips)
        found["flipped_to_right"] = sum(now and not was for was, now in flips)
        found.update(length_ratio(rows))
    return found


def length_ratio(rows: list[dict]) -> dict[str, float]:
    """output_length_ratio: every answer's tokens before EOS over the reference's on the same prompts,
    summed first (the tokens decoded, which is what the answers cost in time), so a row the reference
    answered in no tokens counts without dividing by zero; none where the reference wrote nothing, or
    rows recorded before lengths were kept."""
    if not all("answer_tokens" in row and "reference_tokens" in row for row in rows):
        return {}
    reference = sum(row["reference_tokens"] for row in rows)
    return {"output_length_ratio": sum(row["answer_tokens"] for row in rows) / reference} if reference else {}


def answers(rows: list[dict]) -> list[Answer]:
    """The rows as answers: right where the score reaches RIGHT, and so was the reference's."""
    return [
        Answer(
            row=row["row"],
            repeat=row["repeat"],
            prompt=row["prompt"],
            expected=tuple(row["expected"]),
            answer=row["answer"],
            score=row["score"],
            correct=row["score"] >= RIGHT,
            reference_answer=row.get("reference_answer"),
            reference_correct=row["reference_score"] >= RIGHT if "reference_score" in row else None,
        )
        for row in rows
    ]
