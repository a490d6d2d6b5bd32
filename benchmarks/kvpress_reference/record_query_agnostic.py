"""Record kvpress under its own query-agnostic protocol: for each press x compression ratio and each
passkey prompt, the context pressed alone by kvpress's pipeline (`KVPressTextGenerationPipeline._forward`:
prefill with the press, then its greedy `generate_answer` on the question), the positions each layer
and KV head kept, and the answer. `tests/test_kvpress_query_agnostic.py` holds kvpipe's
`press.protocol=query_agnostic` to them.

Like record.py, this runs in kvpress's own venv and never imports kvpipe; the prompts come from
`prompts.py --query-agnostic` (README.md beside this file).

    python record_query_agnostic.py --model DIR --prompts agnostic.json --output kvpress_query_agnostic.npz
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from kvpress import KnormPress, SnapKVPress, StreamingLLMPress
from kvpress.pipeline import KVPressTextGenerationPipeline
from record import made_by, recording, stacked

RATIOS = (0.25, 0.5, 0.75)
PRESSES = {"streaming": (StreamingLLMPress, {"n_sink": 4}), "knorm": (KnormPress, {}), "snapkv": (SnapKVPress, {"window_size": 64})}  # fmt: skip
MAX_NEW_TOKENS = 12  # kvpipe's passkey default: "The pass key is 12345." is 11 tokens


def found(answer: str, key: str) -> bool:
    """As kvpipe's passkey scorer judges it: the exact key in the answer as a whole number."""
    return re.search(rf"(?<!\d){re.escape(key)}(?!\d)", answer) is not None


def answer_with(pipe, press, prompt: dict) -> tuple[str, np.ndarray | None]:
    """kvpress's own pipeline on token ids: the answer, and what each layer kept ([layers, heads, tokens])."""
    masks = {} if press is None else recording(press)
    inputs = {"context_ids": torch.tensor([prompt["context"]]), "questions_ids": [torch.tensor([prompt["question"]])]}
    with torch.no_grad():
        (answer,) = pipe._forward(inputs, max_new_tokens=MAX_NEW_TOKENS, press=press)
    return answer, stacked(masks) if masks else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a transformers model folder (Llama-style)")
    parser.add_argument("--prompts", required=True, help="JSON from prompts.py --query-agnostic")
    parser.add_argument("--output", required=True, help="the .npz to write")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    prompts = json.loads(Path(args.prompts).read_text())
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, attn_implementation="sdpa", dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    pipe = KVPressTextGenerationPipeline(model=model.eval(), tokenizer=tokenizer)
    arrays, answers = {}, {}
    for index, prompt in enumerate(prompts):
        answers[f"none/{index}"], _ = answer_with(pipe, None, prompt)
    for name, (press_class, settings) in PRESSES.items():
        for ratio in RATIOS:
            for index, prompt in enumerate(prompts):
                answer, kept = answer_with(pipe, press_class(compression_ratio=ratio, **settings), prompt)
                answers[f"{name}/{ratio}/{index}"] = answer
                arrays[f"{name}/{ratio}/{index}"] = np.packbits(kept, axis=-1)
            hits = sum(found(answers[f"{name}/{ratio}/{i}"], p["key"]) for i, p in enumerate(prompts))
            print(f"{name} {ratio}: {hits} of {len(prompts)} keys found", file=sys.stderr)
    meta = {
        **made_by(),
        "presses": {name: {"kvpress": c.__name__, "settings": s} for name, (c, s) in PRESSES.items()},
        "attn_implementation": "sdpa",
        "max_new_tokens": MAX_NEW_TOKENS,
        "prompts": prompts,
        "answers": answers,
    }
    arrays["ratios"] = np.array(RATIOS)
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(args.output, **arrays)


if __name__ == "__main__":
    main()
