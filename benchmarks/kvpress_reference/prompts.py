"""Write the token ids the recorders press, from kvpipe's own passkey prompts through the embedded
model's chat template. Runs in kvpipe's venv (the recorders run in kvpress's).

    python benchmarks/kvpress_reference/prompts.py prompts.json                  # record.py's
    python benchmarks/kvpress_reference/prompts.py --query-agnostic agnostic.json  # record_query_agnostic.py's

The first: 512 tokens, the key halfway in, two trials, as a JSON list of id lists. The second:
1,024 tokens, the key at depths 0.1, 0.5 and 0.9, two trials each, every prompt split where its
question starts (`{"context": ids, "question": ids, "key": "12345", "depth": 0.5, "trial": 0}`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvpipe import model as models
from kvpipe.jobspec import compose, make_spec

OVERRIDES = ["workload=passkey", "workload.context_tokens=[512]", "workload.depths=[0.5]", "workload.trials=2"]
QUERY_AGNOSTIC = ["workload=passkey", "workload.context_tokens=[1024]", "workload.depths=[0.1,0.5,0.9]", "workload.trials=2"]  # fmt: skip


def batches(overrides: list[str]) -> list:
    spec = make_spec(compose(overrides + ["tracking=off"]))
    return spec.bound_workload.batches(models.load_tokenizer(spec.model), "cpu")


def whole_prompts() -> list[list[int]]:
    return [row.tolist() for batch in batches(OVERRIDES) for row in batch.input_ids]


def split_prompts() -> list[dict]:
    split = []
    for batch in batches(QUERY_AGNOSTIC):
        context = batch.input_ids.shape[1] - batch.question_tokens
        for ids, row in zip(batch.input_ids.tolist(), batch.rows):
            split.append({"context": ids[:context], "question": ids[context:], "key": row.key, "depth": row.depth, "trial": row.trial})  # fmt: skip
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output")
    parser.add_argument("--query-agnostic", action="store_true", help="the prompts split at their question")
    args = parser.parse_args()
    Path(args.output).write_text(json.dumps(split_prompts() if args.query_agnostic else whole_prompts()))


if __name__ == "__main__":
    main()
