"""Differences a decision can trust: a run's TPOT or TTFT as a ratio to a baseline run, with a 95%
interval, paired where the two took turns in the same rounds (an interleaved sweep: the same
`kvpipe.round_group`): call by call where they took the same calls (`kvpipe.call_keys`), each call's
turn beside the other's and the turns left out as contended out of both, else round by round; so the
machine's drift, which slows both alike in a turn, cancels (kvpipe.measure.uncertainty.ratio_interval). Its verdict is one of three, in words its
interval bears out: clearly slower or faster (the whole interval lies beyond ±2% of 1), the same
within 2% (the whole interval lies inside that band), or not yet decided (it straddles an edge of
the band); neither compare nor recommend names a winner on the last two (criterion.rs says "no
change", or "within noise threshold")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpipe import cache
from kvpipe.measure.round_figures import CALL_KEYS, CALL_PREFIX, PAIR_PREFIX, TAG_PREFIX, parse_series
from kvpipe.measure.uncertainty import (
    FASTER,
    NEGLIGIBLE,
    NO_INTERVAL,
    SAME,
    SLOWER,
    UNDECIDED,
    ratio_interval,
    verdict,
)
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags

FIGURES = {"tpot_ms": "TPOT", "ttft_ms": "TTFT"}
MOST_ROUNDS_SUGGESTED = 100  # beyond this, "~N rounds might decide it" is not a suggestion worth making
ROUND_GROUP = mlflow_tags.column(mlflow_tags.ROUND_GROUP)
WORDS = {SLOWER: "clearly slower", FASTER: "clearly faster", SAME: f"the same within {NEGLIGIBLE:.0%}",
         UNDECIDED: "not yet decided"}  # fmt: skip


@dataclass(frozen=True)
class Ratio:
    value: float
    low: float
    high: float
    paired: bool  # measured in the same rounds, resampled together
    rounds: int = 0  # the rounds its interval is over (paired: the pairs); 0 where not known
    calls_per_round: int = 1  # paired call by call: each round gave this many of its pairs

    @property
    def state(self) -> str:
        """SLOWER or FASTER where the whole interval lies beyond ±NEGLIGIBLE of 1, SAME where it lies
        inside, UNDECIDED where it straddles an edge of that band; NO_INTERVAL without one."""
        return verdict(self.low, self.high)

    @property
    def clear(self) -> bool:
        """The whole interval lies beyond ±NEGLIGIBLE of 1: one is faster, whatever the drift."""
        return self.state in (SLOWER, FASTER)

    def figures(self) -> str:
        """'1.62× (1.55–1.70)', with † where not paired."""
        if math.isnan(self.low):
            return f"{self.value:.2f}× ({'1 round, ' if self.rounds == 1 else ''}no interval)"
        return f"{self.value:.2f}× ({_bound(self.low)}–{_bound(self.high)})" + ("" if self.paired else " †")

    def text(self) -> str:
        """The verdict and the figures that bear it out: 'clearly slower: 1.09× (1.03–1.16)', 'the
        same within 2%: 1.00× (0.99–1.01)', 'not yet decided: 1.09× (1.01–1.18); ~12 rounds might
        decide it'; the figures alone where there is no interval."""
        if self.state == NO_INTERVAL:
            return self.figures()
        needed = self.rounds_to_decide() if self.state == UNDECIDED else None
        return f"{WORDS[self.state]}: {self.figures()}" + (f"; ~{needed} rounds might decide it" if needed else "")

    def rounds_to_decide(self) -> int | None:
        """Undecided: the rounds at which an interval of this spread, narrowing as 1/√rounds about the
        same centre, would clear the band's nearer edge (a guess: the centre moves as rounds come);
        None where the rounds are not known or it would take more than MOST_ROUNDS_SUGGESTED."""
        if self.rounds < 2 or self.state != UNDECIDED:
            return None
        centre, half = (math.log(self.high) + math.log(self.low)) / 2, (math.log(self.high) - math.log(self.low)) / 2
        room = min(abs(centre - math.log(1 + NEGLIGIBLE)), abs(centre - math.log(1 - NEGLIGIBLE)))
        needed = math.ceil(self.rounds * (half / room) ** 2 / self.calls_per_round) if room else math.inf
        return int(needed) if needed <= MOST_ROUNDS_SUGGESTED else None


def _bound(value: float) -> str:
    """An interval's end to 2 decimals, or as many more as keep it off the band's edge where it is
    not on it (1.018, not 1.02, whose verdict is not yet decided), so that words and figures agree."""
    edges = (1 + NEGLIGIBLE, 1 - NEGLIGIBLE)
    for decimals in range(2, 7):
        text = f"{value:.{decimals}f}"
        if float(text) not in edges or value in edges:
            break
    return text


def series(run, figure: str) -> list[float]:
    """The run's round means of a figure (a row of kvpipe.decide.runs' table)."""
    return parse_series(run.get(mlflow_tags.column(mlflow_tags.of(TAG_PREFIX + figure))))


def same_rounds(run, baseline) -> bool:
    group = run.get(ROUND_GROUP)
    return isinstance(group, str) and bool(group) and group == baseline.get(ROUND_GROUP)


def call_series(run, figure: str) -> list[float]:
    """The run's figure call by call, round after round (an interleaved sweep that took turns by call)."""
    return parse_series(run.get(mlflow_tags.column(mlflow_tags.of(CALL_PREFIX + figure))))


def same_calls(run, baseline, figure: str) -> bool:
    """Whether the two took the same calls in the same turns: then they pair call by call."""
    keys = [r.get(mlflow_tags.column(mlflow_tags.of(CALL_KEYS))) for r in (run, baseline)]
    mine, theirs = call_series(run, figure), call_series(baseline, figure)
    return same_rounds(run, baseline) and isinstance(keys[0], str) and keys[0] == keys[1] and len(mine) == len(theirs)


def ratio(run, baseline, figure: str = "tpot_ms") -> Ratio | None:
    """run's figure over baseline's, or None where either run recorded no round means (runs made
    before kvpipe kept them) or none of them measured it (a TPOT of one-token answers). Paired call
    by call where the two took the same calls in the same turns (what their calls left out as
    contended is out of both), else round by round where they shared rounds, else unpaired."""
    by_call = same_calls(run, baseline, figure)
    mine, theirs = (
        (call_series if by_call else series)(run, figure),
        (call_series if by_call else series)(baseline, figure),
    )
    if not mine or not theirs:
        return None
    paired = same_rounds(run, baseline)
    per_round = max(1, len(mine) // max(1, len(series(run, figure)))) if by_call else 1
    # paired: the pairs both measured (a call left out as contended is out of both)
    counted = sum(a == a and b == b for a, b in zip(mine, theirs)) if paired else min(len(mine), len(theirs))
    found = Ratio(*ratio_interval(mine, theirs, paired), paired=paired, rounds=counted, calls_per_round=per_round)
    return None if math.isnan(found.value) else found  # no round measured the figure in both: no ratio


DEFAULT_BASELINE = cache.DEFAULT_BASELINE  # what others are weighed against, unless --baseline


def named(run, name: str) -> bool:
    """Whether --baseline NAME names this run: its label (dynamic, quantized:quanto:int2:kivi), its
    MLflow run name, or its run id (or the first 8 or more characters of it)."""
    run_name = run.get(mlflow_tags.column("mlflow.runName"))
    return name in (run.get("label"), run_name) or (len(name) >= 8 and str(run.get("run_id", "")).startswith(name))


def with_ratios(runs, baseline: str | None = None):
    """runs with `baseline` (the label of each run's baseline: a run of the named configuration with
    the same workload and prompt length) and `ratio_tpot_ms`, `ratio_ttft_ms` (Ratio, or None).
    A baseline named that matches no run raises ConfigError; the default matching none adds nothing."""
    from kvpipe.errors import ConfigError

    name = baseline or DEFAULT_BASELINE
    chosen = [named(run, name) for _, run in runs.iterrows()]
    beside = [copy_beside(run, name) for _, run in runs.iterrows()]  # pair_on_node: its own copy of the baseline
    lossless = mlflow_tags.column(mlflow_tags.ENGINE_LOSSLESS)
    if baseline is None and not any(chosen) and lossless in runs:  # an engine's runs: its full-precision cache
        chosen = [run.get(lossless) == "true" for _, run in runs.iterrows()]
        name = next((run["label"] for is_base, (_, run) in zip(chosen, runs.iterrows()) if is_base), name)
    if not any(chosen) and not any(copy is not None for copy in beside):
        if baseline is None:
            return runs
        labels = sorted(set(runs["label"]))
        raise ConfigError("--baseline", baseline, f"expected a configuration of these runs: {', '.join(labels)}")
    runs = runs.copy()
    found: dict[tuple, object] = {}
    for is_baseline, (_, run) in zip(chosen, runs.iterrows()):
        if is_baseline:
            found.setdefault(_context(run), run)
    bases, aparts, ratios = [], [], {figure: [] for figure in FIGURES}
    for copy, (_, run) in zip(beside, runs.iterrows()):
        base = copy if copy is not None else found.get(_context(run))
        bases.append(None if base is None else base["label"])
        apart = base is not None and not same_rounds(run, base) and measured_apart(run, base)
        aparts.append(apart)
        for figure in FIGURES:
            same = base is not None and base["run_id"] == run["run_id"]
            ratios[figure].append(None if base is None or same or apart else ratio(run, base, figure))
    runs["baseline"] = bases
    runs["apart"] = aparts  # its baseline measured on another machine, not in turns with it: no ratio
    for figure, values in ratios.items():
        runs[f"ratio_{figure}"] = values
    runs.attrs["baseline"] = name
    return runs


def copy_beside(run, name: str) -> dict | None:
    """The copy of the baseline a run took turns with in its own process (pair_on_node, kvpipe's
    launchers that run each job in a process of its own), as a row ratio() reads, where that copy is
    the configuration `name` labels; else None."""
    label = run.get(_tag(PAIR_PREFIX + "label"))
    if not isinstance(label, str) or label != name:
        return None
    copy = {"label": label, "run_id": None, ROUND_GROUP: run.get(ROUND_GROUP)}
    for figure in FIGURES:
        for prefix in (TAG_PREFIX, CALL_PREFIX):
            copy[_tag(prefix + figure)] = run.get(_tag(PAIR_PREFIX + prefix + figure))
    copy[_tag(CALL_KEYS)] = run.get(_tag(PAIR_PREFIX + CALL_KEYS))
    return copy


def measured_apart(run, baseline) -> bool:
    """Whether two runs were measured on different hosts or devices: their raw timings do not compare."""
    mine, theirs = node(run), node(baseline)
    return mine != theirs and None not in (mine, theirs)


def node(run) -> str | None:
    """`host · device` (its GPU's name, else its CPU model), the machine a run measured on, or None
    where it did not record it."""
    host = run.get(_tag(mlflow_tags.HOST))
    names = (run.get(_tag(name)) for name in ("gpu_name", "cpu_model", "device"))
    device = next((name for name in names if isinstance(name, str) and name), None)
    return f"{host} · {device}" if isinstance(host, str) and device else None


def _tag(name: str) -> str:
    """The table's column of a kvpipe tag (`round_tpot_ms` or `kvpipe.host`)."""
    return mlflow_tags.column(name if name.startswith("kvpipe.") else mlflow_tags.of(name))


def _context(run) -> tuple:
    """What a baseline must share with the run it is weighed against: the kind of workload, the
    prompt length and, for a serving run, its load (not, say, workload.seed, which two runs of one
    configuration may differ by). A figure a run lacks is None, so that two such runs match."""
    found = (
        run.get(run_table.param("workload.kind")),
        run.get("context_tokens"),
        run.get(mlflow_tags.column(mlflow_tags.LOAD)),
    )
    return tuple(None if value is None or value != value else value for value in found)
