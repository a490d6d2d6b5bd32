"""kvpipe: measure KV-cache strategies for Hugging Face transformers.

Importing it sets nothing up: a process that runs a job (the command line, kvpipe.api, a job's
runner) calls kvpipe._startup.prepare() first."""

__version__ = "0.1.0"
