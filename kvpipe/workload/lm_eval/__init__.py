"""workload=lm_eval: lm-evaluation-harness `generate_until` tasks (lm-eval's own, or the user's
task YAMLs under `workload.include_path`) through the job's cache and press.

lm-eval builds each task's prompts (`tasks.py`: its template, few-shot examples, generation kwargs);
kvpipe tokenizes them as lm-eval's HF model does (the tokenizer's BOS once, none where the text
starts with it) and generates their answers in its measured calls; lm-eval scores them (`scoring.py`:
cut at the task's stop sequences, its filters, its metrics, its aggregation). A task's max_gen_toks
sets its answers' length; workload.max_new_tokens only that of a task that sets none (lm-eval's
default). Calls stop at end-of-sequence; stop sequences cut the answer afterwards.

Its quality metric is task_accuracy, shared with workload=dataset: the mean per-document value of
each task's first averaged, higher-is-better metric (exact_match, say) over every task's documents,
with its 95% interval. Each task's own figures are a table (`lm_eval/tasks.json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from typing import List, Optional

from kvpipe.errors import ConfigError
from kvpipe.workload import _encoding
from kvpipe.workload._scored import Scored
from kvpipe.workload.base import Batch, Window, Workload, padded_batch, until_eos
from kvpipe.workload.dataset import Dataset, labelled, reading
from kvpipe.workload.dataset import scoring as labelled_scoring
from kvpipe.workload.lm_eval import scoring, tasks

ARTIFACT_DIR = "lm_eval"  # its answers and per-task figures in the run's MLflow artifacts


class LmEval(Workload):
    name = "lm_eval"
    order = 50
    context_fields = ("tasks", "limit", "num_fewshot")
    # from the repository root: a local task over a local file, with its quality pass, so every metric it declares is made
    test_overrides = ("workload.include_path=examples/lm_eval", "workload.tasks=[kvpipe_questions]",
                      "workload.limit=2", "quality=on", "quality.windows=1", "quality.scored_tokens=4")  # fmt: skip
    metrics = Dataset.metrics  # task_accuracy, its interval, answers changed and flipped: one meaning for both
    quality = Dataset.quality

    @dataclass
    class Settings:
        tasks: List[str] = field(default_factory=list)  # lm-eval task (or group) names
        include_path: Optional[str] = None  # a folder of the user's own task YAMLs
        limit: Optional[int] = None  # each task's first documents; default: all
        num_fewshot: Optional[int] = None  # default: each task's own (lm-eval's rule)
        apply_chat_template: bool = False  # lm-eval's option: prompts through the model's chat template

    def check(self) -> dict:
        checked = super().check()
        names = self.settings.tasks
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError("workload.tasks", names, "expected a list of lm-eval task names, e.g. [gsm8k]")
        if self.settings.limit is not None and self.settings.limit <= 0:
            raise ConfigError("workload.limit", self.settings.limit, "expected a positive number of documents, or null")
        if self.settings.num_fewshot is not None and self.settings.num_fewshot < 0:
            raise ConfigError("workload.num_fewshot", self.settings.num_fewshot, "expected 0 or more, or null")
        self.lm_eval_tasks()  # every problem with the tasks, now: before the model loads
        return {**checked, "tasks": list(names)}

    def default_ignore_eos(self) -> bool:
        """An answer is the text before end-of-sequence, as lm-eval's own model stops there, unless
        the user sets workload.ignore_eos."""
        return False

    def lm_eval_tasks(self) -> dict:
        """The lm-eval tasks by name, loaded once per workload object."""
        if getattr(self, "_tasks", None) is None:
            self._tasks = tasks.load(list(self.settings.tasks), self.settings.include_path, self.settings.num_fewshot)
        return self._tasks

    def identity_extras(self) -> dict:
        """A changed task YAML (or the data beside it) is a new measurement."""
        path = tasks.check_include_path(self.settings.include_path)
        return {"include_digest": reading.digest(path)} if path else {}

    def size_label(self) -> str:
        limit = f" {self.settings.limit} docs" if self.settings.limit else ""
        return f"{','.join(self.settings.tasks)}{limit}"

    # ---- prompts ------------------------------------------------------------------------------

    def requests(self, tokenizer) -> list[tasks.Request]:
        """lm-eval's requests, built once (with the model's chat template where asked for)."""
        if getattr(self, "_requests", None) is None:
            template = self._chat_template(tokenizer) if self.settings.apply_chat_template else None
            self._requests = tasks.requests(
                self.lm_eval_tasks(), self.settings.limit, self.common.max_new_tokens, template
            )
        return self._requests

    @staticmethod
    def _chat_template(tokenizer):
        def render(messages: list[dict], add_generation_prompt: bool = True) -> str:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                 continue_final_message=not add_generation_prompt)  # fmt: skip

        return render

    def batches(self, tokenizer, device: str) -> list[Batch]:
        """Requests of one answer length together, sorted by prompt length, batch_size at a time."""
        encoded = sorted(((r.max_gen_toks, len(ids), i, r, ids) for i, (r, ids) in enumerate(self._encoded(tokenizer))),
                         key=lambda item: item[:3])  # fmt: skip
        batches, size = [], self.common.batch_size
        for new_tokens, group in groupby(encoded, key=lambda item: item[0]):
            group = list(group)
            for start in range(0, len(group), size):
                chunk = group[start : start + size]
                rows, ids = [item[3] for item in chunk], [item[4] for item in chunk]
                batches.append(padded_batch(tokenizer, ids, device, rows, max_new_tokens=new_tokens))
        return batches

    def _encoded(self, tokenizer) -> list[tuple[tasks.Request, list[int]]]:
        # lm-eval's HF model encodes with the tokenizer's special tokens unless the text starts with BOS
        return [(request, _encoding.encode(tokenizer, request.context)) for request in self.requests(tokenizer)]

    def too_long(self, prompt_tokens, new_tokens, positions):
        return ("workload.tasks", self.settings.tasks,
                f"prompts of at most {positions - new_tokens} tokens (fewer workload.num_fewshot?)")  # fmt: skip

    def warmup_key(self, batch: Batch) -> tuple:
        return (batch.input_ids.shape[0], batch.max_new_tokens)

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """Its first `count` prompts; the reference writes what follows."""
        return [Window(ids, None) for _, ids in self._encoded(tokenizer)[:count]]

    def tags(self, tokenizer) -> dict[str, str]:
        from importlib.metadata import version

        tags = {"lm_eval_version": version("lm_eval"),
                "generation": "stops at end-of-sequence or the task's max_gen_toks; stop sequences cut the answer "
                              "after: timings cover the tokens generated"}  # fmt: skip
        return {**tags, **{f"lm_eval_{k}": v for k, v in self.identity_extras().items()}}

    # ---- its scoring and records --------------------------------------------------------------

    def answers(self, tokenizer, eos_ids, batches, calls):
        """The measured calls' answers scored by lm-eval: the first repeat's only where every repeat
        writes the same greedy answers."""
        rows = []
        for repeat in range(len(calls) // len(batches) if self.common.do_sample else 1):
            generated = [call.new_tokens for call in calls[repeat * len(batches) : (repeat + 1) * len(batches)]]
            rows += self._scored_rows(tokenizer, eos_ids, batches, generated, repeat)
        return rows

    def _scored_rows(self, tokenizer, eos_ids, batches, generated, repeat: int = 0) -> list[dict]:
        requests, texts, lengths = [], [], {}
        for batch, tokens in zip(batches, generated):
            for request, row in zip(batch.rows, tokens.tolist()):
                requests.append(request)
                answer = until_eos(row, eos_ids)
                texts.append(_text(tokenizer, answer))
                lengths[request.task, request.instance.doc_id] = len(answer)
        rows = scoring.answer_rows(self.lm_eval_tasks(), requests, texts, repeat)
        # the tokens decoded before end-of-sequence (output_length_ratio), whatever `until` cut after
        return [{**row, "answer_tokens": lengths[row["task"], row["doc_id"]]} for row in rows]

    def against_reference(self, tokenizer, eos_ids, batches, reference, rows):
        """Each answer row with the reference's answer to its document, scored the same way."""
        theirs = {(r["task"], r["doc_id"]): r for r in self._scored_rows(tokenizer, eos_ids, batches, reference)}
        return [_beside(row, theirs[row["task"], row["doc_id"]]) for row in rows]

    def scored(self, rows):
        """task_accuracy over every task's documents with its interval (Wilson's where scores are 0
        or 1); the answers and each task's figures as MLflow tables."""
        if not rows:
            return Scored()
        binary = all(row["score"] in (0.0, 1.0) for row in rows)
        # figures reads the scorer only for its interval: Wilson's for 0/1 scores, else a t interval
        interval_of = labelled_scoring.SCORERS["exact" if binary else "f1"]
        by_name = {metric.name: metric for metric in self.metrics}
        return Scored(
            metrics={by_name[name]: value for name, value in labelled.figures(rows, interval_of).items()},
            rows=rows,
            # each an MLflow trace with its verdict; a document is its row, the target its one expected answer
            answers=labelled.answers([{**row, "row": row["doc_id"], "expected": [row["expected"]]} for row in rows]),
            scorer=f"lm_eval.{'exact' if binary else 'mean'}",
            tables={
                f"{ARTIFACT_DIR}/answers.json": rows,
                f"{ARTIFACT_DIR}/tasks.json": scoring.task_figures(self.lm_eval_tasks(), rows),
            },
        )

    def run_tables(self, answers):
        """Each task's metrics, as lm-eval prints them."""
        from rich.table import Table

        table = Table(title="lm-eval tasks", header_style="bold")
        for column in ("task", "filter", "metric", "value", "stderr", "documents"):
            table.add_column(column, justify="right" if column in ("value", "stderr", "documents") else "left")
        for f in scoring.task_figures(self.lm_eval_tasks(), answers):
            stderr = "" if f["stderr"] is None else f"± {f['stderr']:.4f}"
            table.add_row(f["task"], f["filter"], f["metric"], f"{f['value']:.4f}", stderr, str(f["documents"]))
        return [table]

    def dataset_input(self, tags):
        return ",".join(self.settings.tasks), tags.get("lm_eval_include_digest")


def _beside(row: dict, reference: dict) -> dict:
    """An answer row with the reference's answer to the same document, its score and its length."""
    return {**row, "reference_answer": reference["answer"], "reference_score": reference["score"],
            "reference_tokens": reference["answer_tokens"]}  # fmt: skip


def _text(tokenizer, answer: list[int]) -> str:
    """The answer's tokens (those before end-of-sequence) as lm-eval's HF model decodes them (not
    stripped: a task's filters and metrics see what lm-eval would give them)."""
    return tokenizer.decode(answer, skip_special_tokens=True)
