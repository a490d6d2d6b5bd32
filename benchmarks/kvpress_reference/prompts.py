"""Write the token ids record.py presses: kvpipe's own passkey prompts (512 tokens, the key halfway
in, two trials) through the embedded model's chat template, as a JSON list of id lists. Runs in
kvpipe's venv (record.py runs in kvpress's).

    python benchmarks/kvpress_reference/prompts.py prompts.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvpipe import model as models
from kvpipe.jobspec import compose, make_spec

OVERRIDES = ["workload=passkey", "workload.context_tokens=[512]", "workload.depths=[0.5]", "workload.trials=2"]


def main(output: str) -> None:
    spec = make_spec(compose(OVERRIDES + ["tracking=off"]))
    tokenizer = models.load(spec.model).tokenizer
    batches = spec.bound_workload.batches(tokenizer, "cpu")
    Path(output).write_text(json.dumps([row.tolist() for batch in batches for row in batch.input_ids]))


if __name__ == "__main__":
    main(sys.argv[1])
