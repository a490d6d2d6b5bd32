"""workload=shared_context: many questions on one compressed context, as a chat about one file or a
reused RAG context asks them. Each context is read into the cache once (a press compresses it then,
never seeing a question: press.protocol=query_agnostic by construction), and every question is
answered from a copy of that compressed cache. Its answers are scored as a labelled file's are
(`workload.scorer`, task_accuracy with Wilson's interval); the run records each question's answer,
the context's prefill and compression once per context (context_prefill_ms) and the KV bytes of the
compressed context every question starts from (kv_cache_bytes).

The contexts are a user's JSONL file (`workload.path`), or the bundled example made from seeds
(`documents.py`): coded facts hidden in Python's own documentation, one question per fact.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from kvpipe.errors import ConfigError, require_choice
from kvpipe.workload._encoding import raw_ids, template_parts, with_prefix
from kvpipe.workload._scored import Scored
from kvpipe.workload.base import Batch, Window, Workload
from kvpipe.workload.dataset import Dataset, labelled, reading, scoring
from kvpipe.workload.shared_context import documents

INTRO = "Read the document below. Questions about it follow.\n\n"
ANSWERS_TABLE = "shared_context/answers.json"
EXAMPLE_FIELDS = ("contexts", "context_tokens", "facts")  # what makes the bundled example: unread with a path


class SharedContext(Workload):
    name = "shared_context"
    order = 45
    chat_style = True
    context_fields = ("path", "context_tokens")
    compares_greedy_path = False  # scored against its answers
    questions_after_context = True
    # a labelled file's accuracy, its interval and the answers it counts (never beside a reference's answers)
    metrics = tuple(m for m in Dataset.metrics if m.name.startswith(("task_accuracy", "task_answers")))
    quality = Dataset.quality
    test_overrides = ("workload.contexts=1", "workload.context_tokens=120", "workload.facts=2",
                      "workload.max_new_tokens=4")  # fmt: skip

    @dataclass
    class Settings:
        path: Optional[str] = None  # a JSONL of contexts and their questions; null: the bundled example
        contexts: int = 2  # the bundled example: how many contexts
        context_tokens: int = 1000  # the bundled example: each context's length
        facts: int = 4  # the bundled example: coded facts per context, one question each
        scorer: Optional[str] = None  # how answers are scored (kvpipe.workload.dataset.scoring); default: contains

    def check(self) -> dict:
        """Answers are the text before end-of-sequence, so calls stop there; a file is read and checked
        here, before the model loads."""
        checked = super().check()
        s = self.settings
        require_choice("workload.scorer", self.scorer.name, tuple(scoring.SCORERS))
        if self.common.batch_size != 1:
            raise ConfigError(
                "workload.batch_size", self.common.batch_size,
                "each context is read once and its questions answered one after another; expected 1",
            )  # fmt: skip
        if self.common.do_sample:
            raise ConfigError("workload.do_sample", True, "each question is answered greedily; expected false")
        if s.path is None:
            for name, lowest in (("contexts", 1), ("context_tokens", 1), ("facts", 1)):
                if getattr(s, name) < lowest:
                    raise ConfigError(f"workload.{name}", getattr(s, name), "expected a positive integer")
            if s.facts > len(documents.NAMES):
                raise ConfigError("workload.facts", s.facts, f"expected at most {len(documents.NAMES)}")
        else:
            documents.from_file(s.path, self.scorer)
        return {**checked, "scorer": self.scorer.name}

    def default_ignore_eos(self) -> bool:
        """An answer is the text before end-of-sequence, unless the user sets workload.ignore_eos."""
        return False

    @property
    def scorer(self) -> scoring.Scorer:
        name = self.settings.scorer or scoring.DEFAULT
        require_choice("workload.scorer", name, tuple(scoring.SCORERS))
        return scoring.SCORERS[name]

    def identity(self) -> dict:
        """A file's contexts are its own: the bundled example's settings are left out of its key."""
        values = super().identity()
        return values if self.settings.path is None else {k: v for k, v in values.items() if k not in EXAMPLE_FIELDS}

    def identity_extras(self) -> dict:
        return {} if self.settings.path is None else {"digest": reading.digest(reading.check_path(self.settings.path))}

    def size_label(self) -> str:
        s = self.settings
        return s.path.rsplit("/", 1)[-1] if s.path else f"{s.contexts}x{s.context_tokens}"

    # ---- prompts ------------------------------------------------------------------------------

    def contexts(self, tokenizer) -> list[documents.Context]:
        s = self.settings
        if s.path is not None:
            return self._file_contexts
        return documents.example(tokenizer, s.contexts, s.context_tokens, s.facts, self.common.seed)

    @cached_property
    def _file_contexts(self) -> list[documents.Context]:
        return documents.from_file(self.settings.path, self.scorer)

    def prompt_parts(self, tokenizer, context: documents.Context) -> tuple[list[int], list[list[int]]]:
        """(the context's ids: template prefix, instruction, context; each question's ids after it:
        the question and the template's suffix) through the model's chat template."""
        before, after = template_parts(tokenizer)
        prefix = with_prefix(tokenizer, raw_ids(tokenizer, before))
        suffix = raw_ids(tokenizer, after)
        read = prefix + raw_ids(tokenizer, INTRO) + context.context_ids(tokenizer)
        return read, [raw_ids(tokenizer, f"\n\nQuestion: {q.text}") + suffix for q in context.questions]

    def batches(self, tokenizer, device: str) -> list[Batch]:
        """A batch per context: its ids, read once, and its questions, each answered after it."""
        import torch

        batches = []
        for context in self.contexts(tokenizer):
            read, asked = self.prompt_parts(tokenizer, context)
            input_ids = torch.tensor([read], dtype=torch.long, device=device)
            questions = [torch.tensor([ids], dtype=torch.long, device=device) for ids in asked]
            texts = [q.text for q in context.questions]
            batches.append(Batch(input_ids, torch.ones_like(input_ids), texts, list(context.questions), questions=questions))  # fmt: skip
        return batches

    def check_fits(self, shape, batches: list[Batch]) -> None:
        """The context, its longest question and the new tokens must fit the model's positions."""
        positions, new = shape.max_positions, self.common.max_new_tokens
        for batch in batches:
            longest = batch.prompt_tokens + max(q.shape[1] for q in batch.questions)
            if positions and longest + new > positions:
                raise ConfigError(
                    "workload.path" if self.settings.path else "workload.context_tokens",
                    self.settings.path or self.settings.context_tokens,
                    f"context {batch.rows[0].context} and its longest question are {longest} tokens, which with "
                    f"{new} new tokens exceed the model's {positions} positions",
                )

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """Its first `count` whole prompts (context, then one question); the reference writes what follows."""
        whole = []
        for context in self.contexts(tokenizer):
            read, asked = self.prompt_parts(tokenizer, context)
            whole += [Window(read + question, None) for question in asked]
        return whole[:count]

    # ---- its scoring and records --------------------------------------------------------------

    def answers(self, tokenizer, eos_ids, batches, calls):
        """A row per question of the first round (greedy answers repeat), with its own timings: from its
        copy of the compressed context to its first token, and to its last."""
        rows = []
        for batch, call in zip(batches, calls[: len(batches)]):
            for question, tokens, timing in zip(batch.rows, call.new_tokens.tolist(), call.question_timings):
                answer = labelled.answer_text(tokenizer, tokens, eos_ids)
                rows.append({
                    "context": question.context, "question_number": question.number, "question": question.text,
                    "expected": list(question.answers), "answer": answer,
                    "score": self.scorer.best(answer, list(question.answers)),
                    "first_token_ms": timing.ttft_ms, "answer_ms": timing.e2e_ms,
                })  # fmt: skip
        return rows

    def scored(self, rows):
        """task_accuracy with its 95% interval over every question; the answers as an MLflow table."""
        if not rows:
            return Scored()
        by_name = {metric.name: metric for metric in self.metrics}
        figures = labelled.figures(rows, self.scorer)
        return Scored(
            metrics={by_name[name]: value for name, value in figures.items() if name in by_name},
            rows=rows,
            # each an MLflow trace with its verdict: the context is too long to show, so the question stands for it
            answers=labelled.answers(
                [{**row, "row": index, "repeat": 0, "prompt": row["question"]} for index, row in enumerate(rows)]
            ),  # fmt: skip
            scorer=self.scorer.name,
            tables={ANSWERS_TABLE: rows},
        )

    def tags(self, tokenizer) -> dict[str, str]:
        return {**super().tags(tokenizer), "generation": "each context read once; every question answered from a copy of its compressed cache"}  # fmt: skip
