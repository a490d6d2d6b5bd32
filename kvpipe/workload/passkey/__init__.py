"""workload=passkey: does the cache still find the needle? A seeded key hidden at a depth of filler
text, then a question, through the model's chat template; each prompt exactly `context_tokens` long
(`prompts.py`). Its answers are scored against their keys on the measured calls themselves
(`retrieval.py`), and each run gets a heatmap of length x depth (`heatmap.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, List

from kvpipe.catalogue import Metric
from kvpipe.errors import ConfigError
from kvpipe.units import param_text
from kvpipe.workload._lengths import context_lengths
from kvpipe.workload._scored import Scored, ScoredFile, Step
from kvpipe.workload.base import Batch, Quality, Window, Workload
from kvpipe.workload.passkey import prompts as haystack
from kvpipe.workload.passkey import retrieval

ARTIFACT_DIR = "retrieval"  # its tables and heatmap in the run's MLflow artifacts
SCORER = "passkey_found"  # what judges its answers (prompts.found), as MLflow names its assessments' source


class Passkey(Workload):
    name = "passkey"
    order = 30
    chat_style = True
    context_fields = ("context_tokens",)
    # Its answers are scored against their keys (retrieval_accuracy), which says more than where
    # they left the reference's greedy path.
    compares_greedy_path = False
    names_question = True  # each prompt ends with its question and the template's suffix
    metrics = (
        Metric("retrieval_accuracy", "passkey retrieval", "", ".0%", False, in_run_table=True, compare=True),
        Metric("retrieval_answers", "answers", "", ".0f"),
    )
    quality = Quality(metrics[0], term="retrieval", axis="passkey retrieval accuracy")

    @dataclass
    class Settings:
        # prompt lengths in tokens (one value or a list), the key's depths (fractions of the filler),
        # and prompts per (length, depth) cell
        context_tokens: Any = field(default_factory=lambda: [1000])
        depths: List[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
        trials: int = 2

    def check(self) -> dict:
        """Lengths become a sorted list of distinct positive ints (one value is a list of one)."""
        self.settings.context_tokens = context_lengths(self.settings.context_tokens)
        if not self.settings.depths or not all(0 <= depth <= 1 for depth in self.settings.depths):
            raise ConfigError(
                "workload.depths",
                self.settings.depths,
                "expected fractions of the context from 0 to 1, e.g. [0.1,0.5,0.9]",
            )
        if self.settings.trials <= 0:
            raise ConfigError("workload.trials", self.settings.trials, "expected a positive integer")
        return {**super().check(), "context_tokens": self.settings.context_tokens}

    def size_label(self) -> str:
        return ",".join(str(n) for n in self.settings.context_tokens)

    def longest_prompt_from_config(self) -> int:
        return max(self.settings.context_tokens)

    def too_long(self, prompt_tokens, new_tokens, positions):
        return "workload.context_tokens", self.settings.context_tokens, f"lengths of at most {positions - new_tokens}"

    def prompts(self, tokenizer, lengths: list[int] | None = None) -> list[haystack.PasskeyPrompt]:
        s = self.settings
        return haystack.prompts(tokenizer, lengths or s.context_tokens, s.depths, s.trials, self.common.seed)

    def batches(self, tokenizer, device: str) -> list[Batch]:
        """Prompts of one length share batches of batch_size (equal lengths: no padding); a length's
        last batch may be smaller, as no prompt is repeated to fill it."""
        import torch

        batches = []
        every = self.prompts(tokenizer)
        for length in self.settings.context_tokens:
            same = [p for p in every if p.context_tokens == length]
            for start in range(0, len(same), self.common.batch_size):
                rows = same[start : start + self.common.batch_size]
                input_ids = torch.tensor([p.input_ids for p in rows], dtype=torch.long, device=device)
                texts = [tokenizer.decode(p.input_ids) for p in rows]
                question = {p.question_tokens for p in rows}.pop()  # one question, one template: one length
                batches.append(Batch(input_ids, torch.ones_like(input_ids), texts, rows=rows, question_tokens=question))
        return batches

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """`count` of its longest prompts, one per depth in turn; the reference writes what follows."""
        longest = self.prompts(tokenizer, [max(self.settings.context_tokens)])
        depths = self.settings.depths
        by_depth_first = sorted(longest, key=lambda p: (p.trial, depths.index(p.depth)))
        return [Window(p.input_ids, None) for p in by_depth_first[:count]]

    # ---- its scoring and records --------------------------------------------------------------

    def answers(self, tokenizer, eos_ids, batches, calls):
        return retrieval.score(tokenizer, eos_ids, batches, calls)

    def scored(self, rows):
        """Accuracy over every answer; accuracy and the length's timings stepped by context length;
        the answers and cells as MLflow tables (the run's Evaluation view); the heatmap."""
        from kvpipe.workload.passkey import heatmap

        if not rows:
            return Scored()
        cells = retrieval.cells(rows)
        by_name = {metric.name: metric for metric in self.metrics}
        return Scored(
            metrics={by_name[name]: value for name, value in retrieval.metrics(rows).items()},
            steps=[Step(name, float(value), step) for name, value, step in retrieval.stepped_metrics(rows)],
            rows=rows,
            answers=retrieval.answers(rows),
            scorer=SCORER,
            tables={f"{ARTIFACT_DIR}/answers.json": rows, f"{ARTIFACT_DIR}/cells.json": cells},
            files=[ScoredFile(heatmap.HEATMAP_FILE, ARTIFACT_DIR, partial(heatmap.save, cells))],
        )

    @classmethod
    def compare_section(cls, runs, out_dir):
        from kvpipe.workload.passkey import compared

        return compared.section(runs, out_dir)

    def run_tables(self, answers):
        """Keys found / answers per context length (rows) and depth (columns)."""
        from rich.table import Table

        found = {(c["context_tokens"], c["depth"]): c for c in retrieval.cells(answers)}
        depths = sorted({depth for _, depth in found})
        table = Table(title="passkey found / asked", header_style="bold")
        table.add_column("context tokens", justify="right")
        for depth in depths:
            table.add_column(f"depth {depth:.0%}", justify="right")
        for length in sorted({length for length, _ in found}):
            row = [found.get((length, depth)) for depth in depths]
            table.add_row(f"{length:,}", *(f"{c['found']}/{c['answers']}" if c else "" for c in row))
        return [table]

    def dataset_input(self, tags):
        return f"{self.name} prompts ({param_text(self.settings.context_tokens).strip('[]')} tokens)", None
