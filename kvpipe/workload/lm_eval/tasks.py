"""lm-evaluation-harness tasks, loaded through lm-eval's own TaskManager (the `eval` extra), and
every way a choice of them can be wrong as one line naming the field, before the model loads.

Only `generate_until` tasks decode: a loglikelihood, loglikelihood_rolling or multiple_choice task is
scored in one prefill of context and continuation, so a KV cache never changes its answers. A task's
requests are lm-eval's own (`build_all_requests`: its prompt template, few-shot examples and
generation kwargs); kvpipe generates their answers through the job's cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvpipe.errors import ConfigError, first_line
from kvpipe.workload.dataset import reading

log = logging.getLogger(__name__)

EXTRA = 'needs lm-evaluation-harness, an optional extra: pip install -e ".[eval]"'
DECODES = "generate_until"
FEWSHOT_SEED = 1234  # lm-eval's default fewshot_random_seed: the same few-shot examples as lm-eval picks
LIST_THEM = "`lm-eval ls tasks` lists them"


def require_lm_eval() -> None:
    """lm-eval importable, or one line naming the extra that installs it."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise ConfigError("workload.kind", "lm_eval", EXTRA) from None


def check_include_path(include_path: str | None) -> Path | None:
    if include_path is None:
        return None
    found = Path(include_path).expanduser()
    if not found.is_dir():
        raise ConfigError("workload.include_path", include_path, "no such folder; expected a folder of task YAMLs")
    return found


def load(names: list[str], include_path: str | None, num_fewshot: int | None) -> dict[str, Any]:
    """The tasks by name (a group's subtasks each), each checked to decode through a cache; loaded
    once per process while the include path's files stay the same (result.json's rows are scored
    again when a run is recorded, printed and logged)."""
    require_lm_eval()
    path = check_include_path(include_path)
    return _load(tuple(names), path, num_fewshot, reading.digest(path) if path else None)


@lru_cache(maxsize=8)
def _load(names: tuple[str, ...], include_path: Path | None, num_fewshot: int | None, digest: str | None) -> dict:
    reading.quiet()  # lm-eval reads a task's data through datasets
    manager = _manager(list(names), include_path)
    try:
        loaded = manager.load(list(names))["tasks"]
    except Exception as exc:  # lm-eval's own errors: a bad YAML, a data file it cannot read
        raise ConfigError("workload.tasks", list(names), f"lm-eval could not load them: {first_line(exc)}") from exc
    for name, task in loaded.items():
        _check(name, task)
        _set_fewshot(task, num_fewshot)
    return loaded


def _manager(names: list[str], include_path: Path | None):
    """lm-eval's TaskManager over the include path alone where one is set (scanning lm-eval's ~15,000
    own YAMLs takes most of a minute on 2 cores), else over lm-eval's own tasks."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(include_path) if include_path else None, include_defaults=not include_path)
    missing = [name for name in names if name not in manager.all_tasks]
    if missing and include_path:
        raise ConfigError(
            "workload.tasks",
            missing[0],
            f"no such task in workload.include_path={include_path} (its tasks: {', '.join(manager.all_tasks) or 'none'}); "
            "lm-eval's own tasks run without an include_path",
        )
    if missing:
        raise ConfigError(
            "workload.tasks",
            missing[0],
            f"no such task among lm-eval's own ({LIST_THEM}); set workload.include_path to a folder of your own task YAMLs",
        )
    return manager


def _check(name: str, task) -> None:
    output_type = task.get_config("output_type")
    if output_type != DECODES:
        raise ConfigError(
            "workload.tasks",
            name,
            f"its output_type is {output_type}: scored in one prefill, so a KV cache never changes its answers "
            f"(only {DECODES} tasks decode)",
        )
    repeats = task.get_config("repeats") or 1
    if repeats != 1:
        raise ConfigError(
            "workload.tasks", name, f"it asks {repeats} answers per prompt (repeats); kvpipe decodes each prompt once"
        )
    if quality_metric(task) is None:
        raise ConfigError(
            "workload.tasks",
            name,
            "it has no metric averaged per document where higher is better (e.g. exact_match) to judge answers by",
        )
    generation = task.get_config("generation_kwargs") or {}
    if generation.get("do_sample") or float(generation.get("temperature") or 0) > 0:
        log.warning(
            "task %s asks for sampling (%s); kvpipe's calls sample only where workload.do_sample=true, at the "
            "model's own temperature",
            name,
            {k: generation[k] for k in ("do_sample", "temperature") if k in generation},
        )


def _set_fewshot(task, num_fewshot: int | None) -> None:
    """workload.num_fewshot over the task's own, as lm-eval's simple_evaluate sets it (a task that
    fixes 0 keeps 0)."""
    if num_fewshot is not None and task.get_config("num_fewshot") != 0:
        task.set_config(key="num_fewshot", value=num_fewshot)
    elif task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=FEWSHOT_SEED)


def quality_metric(task) -> str | None:
    """The metric that judges a task's answers: its first averaged per document (lm-eval's `mean`)
    where higher is better."""
    from lm_eval.api.metrics import mean

    better = task.higher_is_better()
    return next((m for m, agg in task.aggregation().items() if agg is mean and better.get(m)), None)


@dataclass(frozen=True)
class Request:
    """One of a task's lm-eval requests: the prompt lm-eval built, its stop sequences and length."""

    task: str
    instance: Any  # lm_eval.api.instance.Instance
    until: tuple[str, ...]
    max_gen_toks: int

    @property
    def context(self) -> str:
        return self.instance.args[0]


def requests(tasks: dict[str, Any], limit: int | None, default_tokens: int, chat_template=None) -> list[Request]:
    """Every task's requests (its first `limit` documents), as lm-eval's evaluator builds them;
    chat_template (messages -> text) where lm-eval's apply_chat_template is asked for."""
    from lm_eval.models.utils import normalize_gen_kwargs

    found = []
    for name, task in tasks.items():
        task.build_all_requests(limit=limit, rank=0, world_size=1, apply_chat_template=chat_template is not None,
                                chat_template=chat_template)  # fmt: skip
        for instance in task.instances:
            generation = normalize_gen_kwargs(instance.args[1], default_tokens)
            until = generation.get("until") or []
            found.append(Request(name, instance, tuple([until] if isinstance(until, str) else until),
                                 generation["max_gen_toks"]))  # fmt: skip
    return found
