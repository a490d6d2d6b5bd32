"""What a workload is: one class that knows everything kvpipe asks about the prompts a job runs.

A workload owns its settings (the `workload.*` fields it reads beyond the common ones), its checks
(against the config alone, and that its prompts fit the model's positions), its batches, the
windows quality scores, the fields that define what it measures (the measurement key, the MLflow
params, the run name and the quality reference's key), and any scoring of its own: its metrics, the
one that judges its answers (`quality`), and a `Scored` that kvpipe.record writes and logs.
Subclassing registers it under `name`; every other module asks the registry (`kvpipe.workload.get`,
`registered`) and never spells a kind. Pure Python at import: torch and the tokenizer arrive as
arguments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional, Sequence

from kvpipe import catalogue
from kvpipe.errors import ConfigError
from kvpipe.registry import Registered, Registry
from kvpipe.workload import _encoding
from kvpipe.workload._compared import RecordedRun, Section
from kvpipe.workload._scored import Scored


@dataclass
class Common:
    """The workload.* settings every kind reads."""

    max_new_tokens: int = 32
    batch_size: int = 1
    do_sample: bool = False
    # generate exactly max_new_tokens, as benchmarks do; null: as the workload decides (default_ignore_eos)
    ignore_eos: Optional[bool] = True
    seed: int = 0
    warmup: int = 1
    repeats: Any = 3  # rounds of every batch; "auto": rounds until the TPOT interval is within target_interval
    noise_threshold: float = 0.15  # a timing_noise_cv above this marks the run noisy (calibrated: docs/benchmarks.md)
    target_interval: float = 0.05  # repeats=auto: the 95% interval's half-width, as a fraction of TPOT
    max_repeats: int = 30  # repeats=auto: the most rounds it adds
    max_measure_s: float = 600.0  # repeats=auto: the most seconds of measured calls, every job of the rounds together
    # repeats=auto in an interleaved sweep: turns until every paired TPOT ratio is within ± this, or clear
    decide_within: float = 0.03


COMMON_FIELDS = tuple(f.name for f in dataclasses.fields(Common))
AUTO_REPEATS = ("target_interval", "max_repeats", "max_measure_s", "decide_within")  # read only where repeats=auto
# How often and how strictly calls are timed: not what the model is given or generates.
TIMING_ONLY = ("warmup", "repeats", "noise_threshold", *AUTO_REPEATS)
# How the job's own calls generate: what the reference's greedy tokens depend on, and its windows do not.
GENERATION = ("max_new_tokens", "batch_size", "do_sample", "ignore_eos")


@dataclass
class Batch:
    """One generate() call: left-padded input ids, their attention mask, the prompt texts, and the
    workload's own per-row facts for its scoring (passkey: each row's key)."""

    input_ids: Any  # torch.LongTensor [batch, prompt_len]
    attention_mask: Any
    texts: list[str]
    rows: list | None = None
    max_new_tokens: int | None = None  # this batch's own length (a dataset's max_new_tokens column)
    # Where the workload knows it: how many trailing tokens of every row are the question (the rest,
    # left of them, is the context). press.protocol=query_agnostic compresses the context alone and
    # feeds these after it; None: the prompt has no split the workload can name.
    question_tokens: int | None = None
    # A workload that asks many questions of one context: input_ids is the context alone (one row),
    # read once; each of these [1, tokens] is a question answered from a copy of the compressed cache.
    questions: list | None = None

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def row_tokens(self) -> list[int]:
        """Each row's prompt length without padding."""
        return [int(n) for n in self.attention_mask.sum(dim=1).tolist()]


@dataclass
class Window:
    """A text quality is scored on: a prefix read into the cache, and what follows it (the
    workload's own text; None where the reference model writes the continuation)."""

    prefix: list[int]
    continuation: list[int] | None


@dataclass(frozen=True)
class Quality:
    """The metric that judges a workload's answers (one of its own `metrics`, a fraction, with the
    metric's direction), and the words limits and plots say it in: `term` ('retrieval', in a limits
    line's `retrieval or task accuracy ≥ 75%`) and `axis` (`passkey retrieval accuracy`)."""

    metric: catalogue.Metric
    term: str
    axis: str

    def loss(self, value: float) -> float:
        """Its value as a loss a search minimises: 1 - value where higher is better."""
        return value if self.metric.lower_is_better else 1 - value

    def objective(self) -> str:
        """What a search calls that loss: `1 - retrieval accuracy`."""
        return self.axis if self.metric.lower_is_better else f"1 - {self.term} accuracy"


@dataclass
class NoSettings:
    """A workload that reads only the common settings."""


class Workload(Registered):
    """Base class: subclass it, set `name` and `Settings`, and override `batches` and `windows`."""

    registry: ClassVar[Registry[Workload]] = Registry("workload.kind")
    order: ClassVar[int] = 100  # listing order; the first registered is the default kind
    Settings: ClassVar[type] = NoSettings  # dataclass of the workload.* fields it alone reads
    chat_style: ClassVar[bool] = False  # renders prompts through the model's chat template
    context_fields: ClassVar[tuple[str, ...]] = ()  # settings that set its prompt length (compare's x axis)
    compares_greedy_path: ClassVar[bool] = True  # quality's first_divergence means something for it
    metrics: ClassVar[tuple[catalogue.Metric, ...]] = ()  # what its own scoring adds to a run (metrics())
    quality: ClassVar[Quality | None] = None  # the one of its metrics that judges its answers (quality_metrics())
    names_question: ClassVar[bool] = False  # its batches set `question_tokens` (press.protocol=query_agnostic)
    questions_after_context: ClassVar[bool] = False  # its batches set `questions`: a press sees the context alone
    # its prompts are turns of sessions (`sessions()`), each turn re-sending the history with the model's
    # answers: a served job sends a session's next turn after its previous answer (kvpipe.job.served_sessions)
    in_sessions: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        quality = cls.__dict__.get("quality")
        if quality is not None and (quality.metric not in cls.metrics or quality.metric.lower_is_better is None):
            raise TypeError(f"{cls.__name__}.quality: expected one of its own metrics, with a direction")
        super().__init_subclass__(**kwargs)  # registers it

    def __init__(self, config):
        """`config` is the workload group (kvpipe.jobspec.schema.WorkloadConfig, or a dict from result.json)."""
        get_value = config.get if isinstance(config, Mapping) else lambda name, default: getattr(config, name, default)
        self.config = config
        self.common = Common(**{f.name: get_value(f.name, f.default) for f in dataclasses.fields(Common)})
        self.settings = self.Settings(
            **{f.name: get_value(f.name, _default(f)) for f in dataclasses.fields(self.Settings)}
        )

    # ---- what it reads ------------------------------------------------------------------------

    @classmethod
    def own_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls.Settings))

    @classmethod
    def read_fields(cls) -> tuple[str, ...]:
        """The workload.* fields (without the prefix) this kind reads: what it measures depends on them."""
        return ("kind", *COMMON_FIELDS, *cls.own_fields())

    def identity(self) -> dict[str, Any]:
        """What defines its measurement: every field it reads, plus what the fields point at where
        that can change under them (a dataset file's content digest)."""
        values = {"kind": self.name, **dataclasses.asdict(self.common), **dataclasses.asdict(self.settings)}
        return {**values, **self.identity_extras()}

    def identity_extras(self) -> dict[str, Any]:
        return {}

    def reference_key(self, generation: bool) -> tuple:
        """The quality reference's key, from the workload's side: its identity less how calls are
        timed, and (generation=False, for scoring windows) less how the job's own calls generate."""
        dropped = TIMING_ONLY + (() if generation else GENERATION)
        return tuple(sorted((k, repr(v)) for k, v in self.identity().items() if k not in dropped))

    def size_label(self) -> str:
        """How big one job is, for the run name after the kind: `32` new tokens by default."""
        return str(self.common.max_new_tokens)

    # ---- checks -------------------------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        """Checks against the config alone; raises ConfigError naming the field. Returns the
        settings it normalised (field -> value), for the Spec to keep."""
        for name in ("max_new_tokens", "batch_size"):
            value = getattr(self.common, name)
            if value <= 0:
                raise ConfigError(f"workload.{name}", value, "expected a positive integer")
        self._check_repeats()
        if not self.common.noise_threshold > 0:
            raise ConfigError(
                "workload.noise_threshold", self.common.noise_threshold, "expected a fraction above 0, e.g. 0.1"
            )
        if self.common.warmup < 0:
            raise ConfigError("workload.warmup", self.common.warmup, "expected 0 or more")
        return {"ignore_eos": self.default_ignore_eos()} if self.common.ignore_eos is None else {}

    def notes(self) -> list[str]:
        """What the settings as given do that the user may not expect, without being wrong: one line
        each, printed with the job's warnings."""
        return []

    def default_ignore_eos(self) -> bool:
        """What workload.ignore_eos=null means for it: True, every call runs to max_new_tokens."""
        return True

    def _check_repeats(self) -> None:
        repeats = self.common.repeats
        if repeats != "auto" and not (isinstance(repeats, int) and not isinstance(repeats, bool) and repeats > 0):
            raise ConfigError("workload.repeats", repeats, "expected a positive integer or auto")
        if repeats != "auto":
            return
        if not 0 < self.common.target_interval < 1:
            raise ConfigError(
                "workload.target_interval", self.common.target_interval, "expected a fraction in (0, 1), e.g. 0.05"
            )
        if not 0 < self.common.decide_within < 1:
            raise ConfigError(
                "workload.decide_within", self.common.decide_within, "expected a fraction in (0, 1), e.g. 0.03"
            )
        if self.common.max_repeats < 2:
            raise ConfigError("workload.max_repeats", self.common.max_repeats, "expected 2 or more")
        if not self.common.max_measure_s > 0:
            raise ConfigError("workload.max_measure_s", self.common.max_measure_s, "expected seconds above 0")

    # ---- the sessions protocol: what a workload in sessions (in_sessions) gives kvpipe.job.served_sessions

    def sessions(self) -> list:
        """The conversations a job serves, in order (a load picks among them as among prompts)."""
        raise NotImplementedError(f"{type(self).__name__} serves prompts, not sessions (in_sessions is False)")

    def turn_ids(self, tokenizer, session, turn: int, answers: Sequence[str]) -> list[int]:
        """Turn `turn`'s prompt ids, the history with the model's `answers` to the turns before it."""
        raise NotImplementedError(f"{type(self).__name__} serves prompts, not sessions (in_sessions is False)")

    @property
    def think_time_s(self) -> float:
        """Seconds from an answer back to the session's next message."""
        return 0.0

    @property
    def keeps_session_cache(self) -> bool:
        """A workload in sessions that keeps each session's cache between its turns (workload.keep_session_cache)."""
        return self.in_sessions and bool(getattr(self.settings, "keep_session_cache", False))

    @property
    def auto_repeats(self) -> bool:
        return self.common.repeats == "auto"

    def check_fits(self, shape, batches: list[Batch]) -> None:
        """Every prompt plus its new tokens must fit the model's positions; checked before the
        weights load, naming the setting that made it so."""
        for batch in batches:
            self._refuse_past_positions(batch.prompt_tokens, batch.max_new_tokens or self.common.max_new_tokens, shape)

    def longest_prompt_from_config(self) -> int | None:
        """The longest prompt in tokens where its settings alone say it (long_context's prompt_tokens,
        passkey's and RULER's context_tokens); None where only the tokenizer can tell."""
        return None

    def check_fits_config(self, shape) -> None:
        """check_fits where the settings alone give the prompt length: made before a job imports
        torch and transformers (a second of CPU for the refusal, not five)."""
        longest = self.longest_prompt_from_config()
        if longest is not None:
            self._refuse_past_positions(longest, self.common.max_new_tokens, shape)

    def _refuse_past_positions(self, prompt_tokens: int, new: int, shape) -> None:
        positions = shape.max_positions
        if positions and prompt_tokens + new > positions:
            field, value, expected = self.too_long(prompt_tokens, new, positions)
            raise ConfigError(field, value, f"expected {expected}: prompt ({prompt_tokens}) + new tokens ({new}) "
                              f"exceed the model's {positions} positions")  # fmt: skip

    def longest_prompt(self, tokenizer, batches: list[Batch]) -> int:
        """The prompt length caches are sized for (longest_prompt_of its batches); a workload whose
        prompts grow while it runs says how long they may grow."""
        return longest_prompt_of(batches, self.common.max_new_tokens)

    def too_long(self, prompt_tokens: int, new_tokens: int, positions: int) -> tuple[str, Any, str]:
        """(field, value, what would fit) for a prompt that does not fit: by default the prompts
        themselves when they alone fill the positions, else workload.max_new_tokens."""
        if prompt_tokens >= positions:
            return "workload.prompts", f"{prompt_tokens} tokens", f"prompts under {positions} tokens"
        return "workload.max_new_tokens", new_tokens, f"at most {positions - prompt_tokens}"

    # ---- prompts ------------------------------------------------------------------------------

    def batches(self, tokenizer, device: str) -> list[Batch]:
        """Every batch of the workload, on the device."""
        raise NotImplementedError

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """`count` texts for quality to score, `scored_tokens` each."""
        raise NotImplementedError

    def warmup_key(self, batch: Batch) -> tuple:
        """Batches that one warm-up call serves: what a warm-up pays for once (allocation, kernels,
        a compile) is per shape, not per prompt."""
        return tuple(batch.input_ids.shape)

    def chat_ids(self, tokenizer, messages: list[dict]) -> list[int]:
        """One chat prompt's ids through the model's template, BOS once; plain text (said once)
        where the tokenizer has no template."""
        if not _encoding.has_chat_template(tokenizer):
            _encoding.warn_no_template(tokenizer, self.name)
        return _encoding.encode(tokenizer, _encoding.chat_text(tokenizer, messages))

    def tags(self, tokenizer) -> dict[str, str]:
        """What the run should say about how its prompts were made."""
        if not self.chat_style:
            return {}
        return {"chat_template": "model" if _encoding.has_chat_template(tokenizer) else "none"}

    # ---- its own scoring and records ----------------------------------------------------------

    def score(self, tokenizer, eos_ids: set[int], batches: list[Batch], calls: list) -> Scored:
        """Its own scoring of the measured calls: its answers, scored."""
        scored = self.scored(self.answers(tokenizer, eos_ids, batches, calls))
        undeclared = [metric.name for metric in scored.metrics if metric not in self.metrics]
        if undeclared:  # the run's table, compare and the docs would not know them
            raise TypeError(f"{type(self).__name__} scored {undeclared}, which its `metrics` do not declare")
        return scored

    def judges_answers(self) -> bool:
        """Whether its prompts carry what judges their answers (its `quality` metric is measured):
        what an accuracy floor (`kvpipe capacity --min-accuracy`) needs, checked before the model loads."""
        return self.quality is not None

    def judges_beside_reference(self) -> bool:
        """Whether the quality pass judges the reference's answers beside its own (its
        `reference_accuracy`): what `kvpipe capacity --max-accuracy-drop` measures its floor from."""
        overridden = type(self).against_reference is not Workload.against_reference
        return self.judges_answers() and self.compares_greedy_path and overridden and not self.common.do_sample

    def answers(self, tokenizer, eos_ids: set[int], batches: list[Batch], calls: list) -> list[dict]:
        """A row per answer of the measured calls (what result.json keeps); none by default."""
        return []

    def against_reference(self, tokenizer, eos_ids: set[int], batches: list[Batch], reference: list, rows: list[dict]):
        """Its answer rows with what the quality reference (a full-precision DynamicCache's greedy
        tokens, [batch, steps] per batch) answered to the same prompts; as they are by default."""
        return rows

    def scored(self, rows: list[dict]) -> Scored:
        """Its answers scored: kvpipe.record calls it again on the rows result.json keeps, so a job just
        run and one `kvpipe sync` uploads long after log the same figures, tables and files."""
        return Scored(rows=rows)

    @classmethod
    def compare_section(cls, runs: list[RecordedRun], out_dir) -> Section | None:
        """Its own part of `compare`, over its recorded runs: a table, and its own plots written in
        out_dir (a Path; None: the table alone). None by default."""
        return None

    def run_tables(self, answers: list[dict]) -> list:
        """rich renderables the run's terminal summary prints after its metrics."""
        return []

    def dataset_input(self, tags: dict[str, str]) -> tuple[str, str | None]:
        """(name, digest or None for MLflow's own) of the run's MLflow dataset input, from what the
        run recorded (its tags): `kvpipe sync` may upload it long after, when files have changed."""
        return f"{self.name} prompts", None


def until_eos(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """The answer the model gave: the tokens before its first end-of-sequence (a call that ignores
    EOS runs past it)."""
    for position, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[:position]
    return tokens


def longest_prompt_of(batches: list[Batch], new_tokens: int) -> int:
    """The prompt length caches are sized for: they hold prompt + workload.max_new_tokens, so the
    longest context less that (a batch with its own, longer, output counts in full)."""
    return max(b.prompt_tokens + (b.max_new_tokens or new_tokens) for b in batches) - new_tokens


def shortest_and_padded(batches: list[Batch]) -> tuple[int, bool]:
    """The shortest prompt (without padding), and whether any batch pads its rows."""
    rows = [(min(b.row_tokens), b.prompt_tokens) for b in batches]
    return min(shortest for shortest, _ in rows), any(shortest != longest for shortest, longest in rows)


def padded_batch(tokenizer, rows: list[list[int]], device: str, facts: list | None = None, **extra) -> Batch:
    """Rows of ids as one left-padded batch (the tokenizer's padding side and pad token)."""
    encoded = tokenizer.pad({"input_ids": rows}, return_tensors="pt", padding=True)
    texts = [tokenizer.decode(ids) for ids in rows]
    return Batch(encoded["input_ids"].to(device), encoded["attention_mask"].to(device), texts, facts, **extra)


def _default(setting: dataclasses.Field):
    if setting.default_factory is not dataclasses.MISSING:
        return setting.default_factory()
    return setting.default


REGISTRY = Workload.registry.classes  # name -> workload class
registered = Workload.registry.registered  # every workload, in listing order
names = Workload.registry.names
get = Workload.registry.get  # raises a one-line ConfigError naming the registered ones


def quality_metrics() -> dict[str, Quality]:
    """Each workload that judges its answers, by kind: the metric that does (passkey: its retrieval
    accuracy). recommend's --min-accuracy, the Pareto front and the search's quality objective read it."""
    return {kind.name: kind.quality for kind in registered() if kind.quality is not None}


def metrics() -> dict[str, catalogue.Metric]:
    """Every metric a run may report, by name: the catalogue's core ones, then each registered
    workload's own (what a run's table and compare list)."""
    return catalogue.catalogue(metric for kind in registered() for metric in kind.metrics)


def reads(kind: str | None, param: str) -> bool:
    """Whether a workload of this kind reads `workload.<field>` (an unknown kind: assume it does)."""
    name = param.removeprefix("workload.")
    if kind not in REGISTRY:
        return True
    return name in REGISTRY[kind].read_fields()
