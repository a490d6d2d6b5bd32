"""kvpipe: measure KV-cache strategies for Hugging Face transformers."""

import os

from kvpipe._startup import defer_hqq_compile

__version__ = "0.1.0"

defer_hqq_compile()
# MLflow 3 reports usage from background threads, which fetch a config and send events to its
# servers, and a process waits for them at exit: ~0.9 s of every tracked kvpipe job (12.5 s against
# 13.4 s, 3 runs each: README, "Where results land"), and traffic an offline or shared machine does not want.
# Off in kvpipe's processes (and the servers and launcher workers they start) unless the user says.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
