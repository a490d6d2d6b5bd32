"""workload=ruler: RULER's synthetic long-context tasks, generated offline from seeds on the model's
own tokenizer, each prompt exactly `context_tokens` long (`tasks.py`): needles of several kinds and
counts, multi-key, multi-value and multi-query retrieval, variable tracking, common- and frequent-
word extraction, and QA over documents. Scored as RULER scores (`scoring.py`), per task and averaged,
with intervals; each run gets a heatmap of task x length, and `compare` puts the runs' side by side
(`compared.py`). Every prompt names its question (`Batch.question_tokens`): the trailing tokens
after the context, for a press that compresses the context alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any, List, Optional

from kvpipe.catalogue import Metric
from kvpipe.errors import ConfigError, require_choice
from kvpipe.units import param_text
from kvpipe.workload import _heatmap
from kvpipe.workload._lengths import context_lengths
from kvpipe.workload._scored import Scored, ScoredFile, Step
from kvpipe.workload.base import Batch, Quality, Window, Workload
from kvpipe.workload.dataset import labelled
from kvpipe.workload.ruler import qa, scoring, sources, tasks
from kvpipe.workload.ruler.heatmap import HEATMAP_FILE, LAYOUT
from kvpipe.workload.ruler.tasks import QA_TASKS, TASKS

ARTIFACT_DIR = "ruler"  # its tables and heatmap in the run's MLflow artifacts


def _task_metrics() -> tuple[Metric, ...]:
    """Each task's accuracy and its interval's ends, declared for every task of the suite."""
    return tuple(
        Metric(name, f"RULER {task}{suffix}", "", ".0%", lower)
        for task in TASKS
        for name, suffix, lower in zip(scoring.task_metrics(task), ("", ", 95% low", ", 95% high"), (False, None, None))
    )


class Ruler(Workload):
    name = "ruler"
    order = 35
    chat_style = True
    context_fields = ("context_tokens",)
    compares_greedy_path = False  # scored against expected answers, which says more
    names_question = True  # each prompt ends with its question, the template's suffix and RULER's answer prefix
    # every task once (each declares a metric the quick job must make), at a length cwe's list fits
    test_overrides = ("workload.context_tokens=[800]", "workload.samples=1", "workload.max_new_tokens=2")
    metrics = (
        Metric("ruler_accuracy", "RULER accuracy", "", ".0%", False, in_run_table=True, compare=True),
        Metric("ruler_accuracy_ci_low", "RULER accuracy, 95% interval's low end", "", ".0%"),
        Metric("ruler_accuracy_ci_high", "RULER accuracy, 95% interval's high end", "", ".0%"),
        Metric("ruler_answers", "RULER answers scored", "", ".0f"),
        *_task_metrics(),
    )
    quality = Quality(metrics[0], term="RULER", axis="RULER accuracy (mean over tasks)")

    @dataclass
    class Settings:
        # prompt lengths in tokens (one value or a list), RULER's tasks by name, prompts per task and
        # length, the user's own haystack text (null: Python's docs) and QA file (null: the example)
        context_tokens: Any = field(default_factory=lambda: [1024])
        tasks: List[str] = field(default_factory=lambda: list(TASKS))
        samples: int = 4
        haystack_path: Optional[str] = None
        qa_path: Optional[str] = None

    def check(self) -> dict:
        s = self.settings
        s.context_tokens = context_lengths(s.context_tokens)
        chosen = [s.tasks] if isinstance(s.tasks, str) else list(s.tasks or [])
        if not chosen:
            raise ConfigError("workload.tasks", s.tasks, f"expected some of {', '.join(TASKS)}")
        for task in chosen:
            require_choice("workload.tasks", task, TASKS)
        s.tasks = [task for task in TASKS if task in chosen]
        if s.samples <= 0:
            raise ConfigError("workload.samples", s.samples, "expected a positive integer")
        if s.haystack_path is not None:
            sources.read_haystack(s.haystack_path)
        self.qa_rows()  # a QA file's problems, now: before the model loads
        return {**super().check(), "context_tokens": s.context_tokens, "tasks": s.tasks}

    def qa_rows(self) -> list[qa.Row]:
        """The QA rows its qa tasks ask, read and checked once per workload object."""
        return self._qa_rows

    @cached_property
    def _qa_rows(self) -> list[qa.Row]:
        asked = [task for task in self.settings.tasks if task in QA_TASKS]
        if not asked:
            return []
        rows = qa.read(self.settings.qa_path)
        for task in asked:
            if not qa.eligible(rows, QA_TASKS[task]):
                kind = "several documents (context: a list of texts)" if QA_TASKS[task] else "one document"
                raise ConfigError("workload.qa_path", self.settings.qa_path,
                                  f"has no row with {kind}, which {task} asks; expected such rows, or "
                                  f"workload.tasks without {task}")  # fmt: skip
        return rows

    def identity_extras(self) -> dict:
        """A file the prompts are made of can change under its name: its content digest."""
        from kvpipe.workload.dataset.reading import digest

        files = {"haystack_digest": self.settings.haystack_path, "qa_digest": self.settings.qa_path}
        return {key: digest(Path(path).expanduser()) for key, path in files.items() if path is not None}

    def size_label(self) -> str:
        return ",".join(str(n) for n in self.settings.context_tokens)

    def longest_prompt_from_config(self) -> int:
        return max(self.settings.context_tokens)

    def too_long(self, prompt_tokens, new_tokens, positions):
        return "workload.context_tokens", self.settings.context_tokens, f"lengths of at most {positions - new_tokens}"

    # ---- prompts ------------------------------------------------------------------------------

    def prompts(self, tokenizer, lengths: list[int] | None = None) -> list:
        """Every prompt: each task, each length, each sample, in that order."""
        s = self.settings
        materials = tasks.Materials(tokenizer, s.haystack_path, self.qa_rows(), self.common.seed)
        return [
            tasks.prompt(task, materials, length, sample)
            for task in s.tasks
            for length in lengths or s.context_tokens
            for sample in range(s.samples)
        ]

    def new_tokens(self, task: str) -> int:
        """RULER's answer length for the task, within workload.max_new_tokens."""
        return min(TASKS[task].new_tokens, self.common.max_new_tokens)

    def batches(self, tokenizer, device: str) -> list[Batch]:
        """Prompts of one task and length share batches of batch_size (equal lengths: no padding),
        where their questions are as long too (a batch has one question_tokens)."""
        import torch

        groups: dict[tuple, list] = {}
        for prompt in self.prompts(tokenizer):
            groups.setdefault((prompt.task, prompt.context_tokens, prompt.question_tokens), []).append(prompt)
        batches = []
        for (task, _, question_tokens), same in groups.items():
            for start in range(0, len(same), self.common.batch_size):
                rows = same[start : start + self.common.batch_size]
                input_ids = torch.tensor([p.input_ids for p in rows], dtype=torch.long, device=device)
                texts = [tokenizer.decode(p.input_ids) for p in rows]
                batches.append(Batch(input_ids, torch.ones_like(input_ids), texts, rows=rows,
                                     max_new_tokens=self.new_tokens(task), question_tokens=question_tokens))  # fmt: skip
        return batches

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """`count` prompts of the longest length, one task after another; the reference writes what follows."""
        longest = self.prompts(tokenizer, [max(self.settings.context_tokens)])
        task_first = sorted(longest, key=lambda p: (p.sample, self.settings.tasks.index(p.task)))
        return [Window(p.input_ids, None) for p in task_first[:count]]

    # ---- its scoring and records --------------------------------------------------------------

    def answers(self, tokenizer, eos_ids, batches, calls):
        return scoring.score(tokenizer, eos_ids, batches, calls, {name: task.match for name, task in TASKS.items()})

    def scored(self, rows):
        """The suite's and each task's accuracy with intervals; per length, stepped; the answers and
        cells as MLflow tables; the task x length heatmap."""
        if not rows:
            return Scored()
        by_name = {metric.name: metric for metric in self.metrics}
        cells = scoring.cells(rows)
        return Scored(
            metrics={by_name[name]: value for name, value in scoring.figures(rows).items()},
            steps=[Step(name, float(value), step) for name, value, step in scoring.stepped_metrics(rows)],
            rows=rows,
            answers=_answers(rows),
            scorer="ruler.string_match",
            tables={f"{ARTIFACT_DIR}/answers.json": rows, f"{ARTIFACT_DIR}/cells.json": cells},
            files=[ScoredFile(HEATMAP_FILE, ARTIFACT_DIR, partial(_heatmap.save, cells, LAYOUT))],
        )

    @classmethod
    def compare_section(cls, runs, out_dir):
        from kvpipe.workload.ruler import compared

        return compared.section(runs, out_dir)

    def run_tables(self, answers):
        """Accuracy per task (rows) and context length (columns), and the mean over tasks."""
        from rich.table import Table

        cells = {(c["task"], c["context_tokens"]): c for c in scoring.cells(answers)}
        lengths = sorted({length for _, length in cells})
        table = Table(title="RULER accuracy by task", header_style="bold")
        table.add_column("task")
        for length in lengths:
            table.add_column(f"{length:,} tokens", justify="right")
        for task in [t for t in TASKS if any(t == name for name, _ in cells)]:
            table.add_row(task, *(f"{cells[task, n]['accuracy']:.0%}" if (task, n) in cells else "" for n in lengths))
        means = {
            step: value for name, value, step in scoring.stepped_metrics(answers) if name == "ruler_accuracy/all_tasks"
        }
        table.add_row("[bold]mean over tasks", *(f"{means[n]:.0%}" for n in lengths))
        return [table]

    def dataset_input(self, tags):
        return f"{self.name} prompts ({param_text(self.settings.context_tokens).strip('[]')} tokens)", None


def _answers(rows: list[dict]):
    """Each answer for its MLflow trace with its verdict: the haystack is too long to show, so the task,
    length and question stand for the prompt."""
    numbered = [
        {**row, "row": number, "prompt": f"{row['task']}, {row['context_tokens']:,} tokens, sample {row['sample']}: {row['question']}"}
        for number, row in enumerate(rows)
    ]  # fmt: skip
    return labelled.answers(numbered)
