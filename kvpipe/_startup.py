"""Start-up cost that kvpipe does not need to pay.

transformers.cache_utils imports hqq whenever hqq is installed, and hqq.core.quantize decorates
three methods with `@torch.compile()` at import time. Decorating compiles nothing (torch.compile
compiles on a first call), but it imports torch._dynamo and torch._inductor: about 2.5 s of every
kvpipe process's start on 2 cores, for a job that never compiles. So while hqq.core.quantize is
imported, torch.compile is a lazy stand-in that calls the real one on first use; the module gets the
same functions, compiled at the same moment, and torch.compile is itself again once it is imported.
A process that does compile (static_compiled) imports torch._dynamo then, not before.

Large imports also run with Python's collector paused (collector_paused): they make hundreds of
thousands of objects that live as long as the process, and full passes over them cost a fifth of
the imports' time."""

from __future__ import annotations

import functools
import gc
import importlib.abc
import os
import sys
from contextlib import contextmanager

DEFERRED = "hqq.core.quantize"


def lazy_compile(real_compile):
    def compile(model=None, **options):
        if model is None:  # used as @torch.compile(...)
            return lambda fn: compile(fn, **options)
        compiled = None

        @functools.wraps(model)
        def call(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = real_compile(model, **options)
            return compiled(*args, **kwargs)

        return call

    return compile


class _DeferCompileLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        import torch

        real = torch.compile
        torch.compile = lazy_compile(real)
        try:
            self.loader.exec_module(module)
        finally:
            torch.compile = real


class _DeferCompileFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != DEFERRED:
            return None
        sys.meta_path.remove(self)  # find the real module once, then step aside
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _DeferCompileLoader(spec.loader)
        return spec


def defer_hqq_compile() -> None:
    if DEFERRED not in sys.modules and not any(isinstance(f, _DeferCompileFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferCompileFinder())


def prepare() -> None:
    """What a process does before it runs a job (the CLI, kvpipe.api, a job's runner, the import of
    torch and transformers for one): hqq's import-time compile deferred, and MLflow's telemetry off.
    MLflow 3 reports usage from background threads, which fetch a config and send events to its
    servers, and a process waits for them at exit: ~0.9 s of every tracked kvpipe job (12.5 s against
    13.4 s, 3 runs each), and traffic an offline or shared machine does not want. Off in kvpipe's
    processes (and the servers and launcher workers they start, which inherit it) unless the user says."""
    defer_hqq_compile()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@contextmanager
def collector_paused():
    """Python's collector off for a burst of long-lived allocations (imports), then as it was."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
