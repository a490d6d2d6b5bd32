"""kvpipe: measure KV-cache strategies for Hugging Face transformers."""

from kvpipe._startup import defer_hqq_compile

__version__ = "0.1.0"

defer_hqq_compile()
