"""What one job measured, in plain types (JSON-ready): the runner's and the serving job's answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpipe.workload import Scored


@dataclass
class JobResult:
    """Everything one job measured, in plain types (JSON-ready)."""

    metrics: dict[str, float]
    tags: dict[str, str]
    texts: list[dict[str, str]]
    notes: list[str] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)  # what the job resolved: dtype, device, architecture
    scored: Scored = field(default_factory=Scored)  # the workload's own scoring (its metrics are in `metrics` too)
    requests: list[dict] = field(default_factory=list)  # a served job's: each request as served (request_rows)
    # wall-clock span (time.time()) from the job's first step to its summary: MLflow's Duration
    started_epoch_s: float | None = None
    ended_epoch_s: float | None = None
    # what its process did once (importing torch and transformers, loading the model) and a later
    # job in the same process skips: not the job's own cost (a sweep's ETA leaves it out)
    process_setup_s: float | None = None

    @property
    def answers(self) -> list[dict]:
        """The workload's own rows, a row per answer (result.json's `answers`)."""
        return self.scored.rows


def resolved_params(loaded, threads: int, setup_params: dict[str, str]) -> dict[str, str]:
    """What a job resolved, as params: the model's dtype, device and threads, its architecture from
    the loaded config, and what the cache's build resolved."""
    from kvpipe import model

    return {
        "model.dtype": loaded.dtype,
        "model.device": loaded.device,
        "model.threads": str(threads),
        **model.architecture_params(loaded.model.config.to_dict(), loaded.shape),
        **setup_params,
    }
