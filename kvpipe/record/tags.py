"""Every MLflow tag kvpipe writes or reads, named once. A run's own tags (Result.tags: the cache it
ran, the environment, noisy, contended...) are written as `kvpipe.NAME`; MLflow's search and its
runs table name them `tags.kvpipe.NAME`."""

from __future__ import annotations

PREFIX = "kvpipe."
PARENT = "mlflow.parentRunId"  # MLflow's own nesting tag: the UI shows children under the parent
RUN_ID = "mlflow.runId"

# a job's run
STATUS = "kvpipe.status"  # FINISHED, FAILED, KILLED or SKIPPED: set last, once the run is whole
KEY = "kvpipe.measurement_key"  # what it measured: equal for jobs that measure the same (resume finds them)
ERROR = "kvpipe.error"
SKIPPED = "kvpipe.skipped"  # why a sweep skipped the job
COMMAND = "kvpipe.command"  # what the user typed
OVERRIDES = "kvpipe.overrides"  # the job's own Hydra overrides: what measures it again

# a sweep's parent run
SWEEP = "kvpipe.sweep"  # "true" on a sweep's parent
SIGNATURE = "kvpipe.sweep_signature"  # equal for the same sweep asked again (a search resumes its parent)
SWEEP_DIR = "kvpipe.sweep_dir"
TOTAL_JOBS = "kvpipe.total_jobs"
MEASURED_ORDER = "kvpipe.measured_order"  # interleaved (rounds taking turns), sequential or alone; a job's too

# what the job's record carries (Result.tags), read back by compare, recommend and the calibration
CACHE_REQUESTED, CACHE_EFFECTIVE = "kvpipe.cache.requested", "kvpipe.cache.effective"
PEAK_MEMORY_SOURCE = "kvpipe.peak_memory_source"
NOISY, CONTENDED = "kvpipe.noisy", "kvpipe.contended"
FALLBACK_TO = "kvpipe.fallback_to"
HOST, DEVICE, TORCH_THREADS = "kvpipe.host", "kvpipe.device", "kvpipe.torch_threads"
ROUND_GROUP = "kvpipe.round_group"  # jobs that took turns in the same rounds share it: their rounds pair
LOAD = "kvpipe.load"  # a serving run's load, as its label says it: concurrency(4), rate(2/s)


def of(name: str) -> str:
    """A Result tag's MLflow name: `noisy` -> `kvpipe.noisy`."""
    return PREFIX + name


def column(tag: str) -> str:
    """The tag's column in MLflow's runs table (mlflow.search_runs): `tags.kvpipe.noisy`."""
    return f"tags.{tag}"


def equals(tag: str, value: str) -> str:
    """An MLflow search filter on the tag."""
    return f"tags.`{tag}` = '{value}'"
