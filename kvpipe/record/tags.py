"""Every MLflow tag kvpipe writes or reads, named once. A run's own tags (Result.tags: the cache it
ran, the environment, noisy, contended...) are written as `kvpipe.NAME`; MLflow's search and its
runs table name them `tags.kvpipe.NAME`."""

from __future__ import annotations

PREFIX = "kvpipe."
PARENT = "mlflow.parentRunId"  # MLflow's own nesting tag: the UI shows children under the parent
RUN_ID = "mlflow.runId"
# MLflow 3's UI opens an experiment without a kind in its GenAI view, which lists traces, not runs;
# this kind (one its UI knows, mlflow.utils.mlflow_tags has no name for it) opens the runs table.
EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_DEVELOPMENT = "custom_model_development"
NOTE = "mlflow.note.content"  # MLflow's own: the run page's description, in Markdown
NOTE_MAX_CHARS = 8000  # mlflow.utils.validation.MAX_TAG_VAL_LENGTH, the size of a SQL store's tag column

# a job's run
STATUS = "kvpipe.status"  # FINISHED, FAILED, KILLED or SKIPPED: set last, once the run is whole
KEY = "kvpipe.measurement_key"  # what it measured: equal for jobs that measure the same (resume finds them)
ERROR = "kvpipe.error"
SKIPPED = "kvpipe.skipped"  # why a sweep skipped the job
COMMAND = "kvpipe.command"  # what the user typed
OVERRIDES = "kvpipe.overrides"  # the job's own Hydra overrides: what measures it again
JOB_ID = "kvpipe.job_id"  # its result.json's job_id: an upload (live or `kvpipe sync`) looks for it first

# a sweep's parent run (its description, NOTE: the compare table)
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
# a run served by an engine's own server (engine=llama_cpp): the server's command line, in the engine's
# words (what recommend's `use:` says), and whether its KV cache is its full-precision one (the baseline)
ENGINE_COMMAND, ENGINE_LOSSLESS = "kvpipe.engine_command", "kvpipe.engine_lossless"


def of(name: str) -> str:
    """A Result tag's MLflow name: `noisy` -> `kvpipe.noisy`."""
    return PREFIX + name


def column(tag: str) -> str:
    """The tag's column in MLflow's runs table (mlflow.search_runs): `tags.kvpipe.noisy`."""
    return f"tags.{tag}"


def equals(tag: str, value: str) -> str:
    """An MLflow search filter on the tag."""
    return f"tags.`{tag}` = '{value}'"


def note(markdown: str, full_at: str, limit: int = NOTE_MAX_CHARS) -> str:
    """Markdown as a run's description (NOTE): whole where it fits, else its lines up to the limit
    and a last line naming `full_at`, where the whole is. MLflow itself would cut mid-row."""
    if len(markdown) <= limit:
        return markdown
    # a blank line first: a line right after a table's rows would read as one more row
    ending = f"\n\n*Cut at MLflow's {limit:,}-character limit: the whole table is this run's artifact {full_at}.*\n"
    kept, size = [], len(ending)
    for line in markdown.splitlines(keepends=True):
        if size + len(line) > limit:
            break
        kept.append(line)
        size += len(line)
    return "".join(kept).rstrip("\n") + ending
