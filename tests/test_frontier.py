"""The frontier walk (kvpipe.orchestrate.search.frontier), on a space of the registries and figures made up to
follow, or to test, the order of quality it relies on: no job runs."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from kvpipe.orchestrate.search.frontier import (
    FrontierSampler,
    at_least_as_safe,
    hypervolume_gains,
    inferred_misses,
    safer_neighbours,
)
from kvpipe.orchestrate.search.space import build

# The benchmark's reduced space: 3 dense points, quanto and hqq x 2 and 4 bits x 2 layouts x 2 residuals
RESTRICT = {"cache": ["dynamic", "static", "quantized"], "backend.nbits": ["2", "4"], "axis": ["kivi", "per_token"],
            "backend.q_group_size": ["64"], "backend.residual_length": ["0", "128"]}  # fmt: skip
LIMIT = 0.05


def space():
    return build(head_dim=64, device="cpu", restrict=RESTRICT)


def figures(point) -> list[float]:
    """[KV bytes, TPOT ms, KL]: bytes fall with bits and rise with the residual; 2 bits miss the KL limit,
    4 bits meet it except quanto per_token without a residual; per_token is the faster layout."""
    if point.get("backend") is None:
        tpot = {"cache=dynamic": 69.0, "cache=static": 66.0}.get(point.label(), 53.0)
        return [3.4e6 if point.get("cache") == "dynamic" else 3.5e6, tpot, 0.0]
    bits, residual = int(point.get("backend.nbits")), int(point.get("backend.residual_length"))
    kivi, hqq = point.get("axis") == "kivi", point.get("backend") == "hqq"
    memory = 3.4e6 * (residual / 256 + (1 - residual / 256) * bits / 16) + (1e5 if kivi else 0)
    kl = (0.5 if bits == 2 else 0.02) * (0.3 if residual else 1.0) * (0.5 if kivi else 1.0) * (1.2 if hqq else 1.0)
    if bits == 4 and not kivi and not residual and not hqq:
        kl = 0.15
    return [memory, 80.0 + (10 if kivi else 0) + (15 if hqq else 0) - residual / 32, kl]


def replay(trials: int, until=None) -> list:
    """The sampler's choices, each told its made-up figures as the search tells a measured trial;
    at most `trials`, or fewer once `until(chosen)` holds."""
    the_space = space()
    study = optuna.create_study(directions=["minimize"] * 3, sampler=FrontierSampler(
        the_space, lambda p: figures(p)[0], LIMIT))  # fmt: skip
    distributions = {n: CategoricalDistribution(v) for n, v in the_space.choices().items()}
    chosen = []
    while len(chosen) < trials and not (until and until(chosen)):
        trial = study.ask(distributions)
        point = the_space.decode(trial.params)
        assert point not in chosen, "the walk asked for a point twice"
        values = figures(point)
        trial.set_user_attr("constraints", [values[2] / LIMIT - 1])
        study.tell(trial, values)
        chosen.append(point)
    return chosen


def test_the_reference_first_then_each_backend_once_then_the_other_dense_points():
    chosen = replay(5)
    assert chosen[0].label() == "cache=dynamic"
    assert [p.get("backend") for p in chosen[1:3]] == ["quanto", "hqq"] or [p.get("backend") for p in chosen[1:3]] == [
        "hqq",
        "quanto",
    ]
    for first in chosen[1:3]:
        assert first.get("backend.nbits") == "4" and first.get("backend.residual_length") == "128"
        assert not safer_neighbours(space(), first)  # nothing in its family keeps more exact
    assert {p.label() for p in chosen[3:5]} == {"cache=static", "cache=static cache.compile=true"}


def test_seven_jobs_measure_the_points_the_benchmarks_walk_measured():
    """docs/benchmarks.md's search against the grid: the dense variants, quanto and HQQ kivi at residual
    128 and then at 0 (the order changed since: the reference, each backend once, then the rest)."""
    labels = {p.label() for p in replay(7)}
    assert {"cache=dynamic", "cache=static", "cache=static cache.compile=true"} <= labels
    assert sum("axis=kivi" in label for label in labels) == 4


def test_nothing_below_a_point_that_missed_the_limit_is_asked_and_the_front_is_found_in_fewer_jobs():
    the_space = space()
    every = {p: figures(p) for p in the_space.points}
    feasible = {p: v for p, v in every.items() if v[2] <= LIMIT}
    front = [p for p, v in feasible.items() if not any(
        all(a <= b for a, b in zip(w, v)) and w != v for w in feasible.values())]  # fmt: skip
    chosen = replay(len(the_space.points), until=lambda chosen: set(front) <= set(chosen))
    assert set(front) <= set(chosen)
    assert len(chosen) < len(the_space.points)
    # every 2-bit point without a residual lies below a 2-bit one with it, which missed: none measured
    assert not [p for p in chosen if p.get("backend.nbits") == "2" and p.get("backend.residual_length") == "0"]
    measured = {p: every[p] for p in chosen}
    for point in chosen:
        missed_above = [q for q in measured if q != point and measured[q][2] > LIMIT and at_least_as_safe(q, point)]
        assert not missed_above, f"{point.label()} was asked below {missed_above[0].label()}, which missed"


def test_inferred_misses_name_the_measured_point_that_proves_them():
    the_space = space()
    two_bits_kept = next(p for p in the_space.points if p.get("backend") == "quanto" and p.get("backend.nbits") == "2"
                         and p.get("axis") == "kivi" and p.get("backend.residual_length") == "128")  # fmt: skip
    inferred = inferred_misses(the_space, {two_bits_kept: [1.6e6, 85.0, 0.36]}, LIMIT)
    below = [p for p in the_space.points if p != two_bits_kept and at_least_as_safe(two_bits_kept, p)]
    # 2 bits without the residual, and per_token at 2 bits with or without it (kivi keeps more exact)
    assert set(inferred) == set(below) and len(below) == 3
    assert inferred[below[0]] == (two_bits_kept, 0.36)
    assert inferred_misses(the_space, {two_bits_kept: [1.6e6, 85.0, 0.36]}, None) == {}  # no limit, no inference


def test_a_pruned_or_failed_neighbour_does_not_block_the_walk():
    the_space = space()
    sampler = FrontierSampler(the_space, lambda p: figures(p)[0], LIMIT)
    dense = [p for p in the_space.points if p.get("backend") is None]
    tops = [p for p in the_space.points if p.get("backend") and not safer_neighbours(the_space, p)]
    trials = [_trial(p, figures(p), the_space) for p in dense] + [_trial(p, None, the_space) for p in tops]
    nxt = sampler.next_point(trials)
    assert nxt is not None and nxt.get("backend") and nxt not in tops
    assert all(n in tops for n in safer_neighbours(the_space, nxt))


def test_a_neighbour_that_missed_only_a_tpot_limit_does_not_block_the_walk():
    the_space = space()
    sampler = FrontierSampler(the_space, lambda p: figures(p)[0], LIMIT)
    dense = [p for p in the_space.points if p.get("backend") is None]
    tops = [p for p in the_space.points if p.get("backend") and not safer_neighbours(the_space, p)]
    too_slow = [0.0, 1.0]  # within the KL limit, twice over a TPOT limit
    trials = [_trial(p, figures(p), the_space) for p in dense] + [
        _trial(p, figures(p), the_space, constraints=too_slow) for p in tops
    ]
    nxt = sampler.next_point(trials)
    assert nxt is not None and nxt not in tops and all(n in tops for n in safer_neighbours(the_space, nxt))


def _trial(point, values, the_space, constraints=None, state=None, user_attrs=None):
    params = the_space.encode(point)
    distributions = {n: CategoricalDistribution(v) for n, v in the_space.choices().items()}
    state = state or (TrialState.COMPLETE if values else TrialState.PRUNED)
    attrs = {"constraints": constraints or [values[2] / LIMIT - 1]} if values else {"outcome": "pruned"}
    attrs = user_attrs if user_attrs is not None else attrs
    return optuna.trial.create_trial(state=state, params=params, distributions=distributions, values=values,
                                     user_attrs=attrs)  # fmt: skip


@pytest.mark.parametrize("sampler", ["frontier", "nsga2"])
def test_the_sweeper_takes_either_sampler_and_refuses_others_in_one_line(sampler, tmp_path):
    from kvpipe.decide.limits import Limits
    from kvpipe.errors import ConfigError
    from kvpipe.orchestrate.search.sweeper import SearchSettings
    from kvpipe.orchestrate.search.trials import Search

    chat = SimpleNamespace(bound_workload=SimpleNamespace(metrics=[], quality=None))

    def search(name):
        return Search(SearchSettings(sampler=name), [], chat, space(), Limits(), "cpu", None, tmp_path, tmp_path)

    assert (
        type(search(sampler)._sampler()).__name__ == {"frontier": "FrontierSampler", "nsga2": "NSGAIISampler"}[sampler]
    )
    with pytest.raises(ConfigError, match="hydra.sweeper.sampler.*frontier, nsga2"):
        search("tpe")._sampler()


@pytest.mark.slow  # composes a config and loads tiny_random's tokenizer
def test_the_search_skips_what_it_infers_unless_every_point_is_measured(tmp_path, capsys):
    from test_search import JOB, SPACE  # dynamic, and hqq per-token at 2 and 4 bits

    from kvpipe.orchestrate.search.study import MEASURED, Seen
    from kvpipe.orchestrate.search.sweeper import SearchSettings
    from kvpipe.orchestrate.search.trial_log import print_closing_line
    from kvpipe.orchestrate.search.trials import Search

    def search(trials):
        return Search.start(SearchSettings(trials=trials), [*JOB, *SPACE], tmp_path, tmp_path / "sweep")

    budget = search(trials=2)
    dense, two_bits, four_bits = budget.space.points
    budget.seen[four_bits] = Seen(MEASURED, [1e4, 5.0, 0.5], [9.0])  # missed the default KL limit of 0.05
    assert budget._left() == [dense]  # 2 bits lies below it: inferred to miss, not measured
    assert two_bits in budget._inferred()
    print_closing_line(budget, budget._inferred())
    assert "1 measured, 0 reused, 0 pruned, 0 failed, 1 inferred" in capsys.readouterr().err
    exhaustive = search(trials=3)
    exhaustive.seen[four_bits] = Seen(MEASURED, [1e4, 5.0, 0.5], [9.0])
    assert exhaustive._left() == [dense, two_bits]  # a grid measures everything


def test_a_trial_killed_mid_job_is_asked_again_and_one_that_failed_is_not():
    the_space = space()
    sampler = FrontierSampler(the_space, lambda p: figures(p)[0], LIMIT)
    dense = [p for p in the_space.points if p.get("backend") is None]
    trials = [_trial(p, figures(p), the_space) for p in dense]
    asked = sampler.next_point(trials)
    killed = _trial(asked, None, the_space, state=TrialState.FAIL, user_attrs={})  # left RUNNING by a kill
    assert sampler.next_point([*trials, killed]) == asked
    failed = _trial(asked, None, the_space, state=TrialState.FAIL, user_attrs={"outcome": "failed"})
    assert sampler.next_point([*trials, failed]) != asked


def test_progress_counts_jobs_against_the_budget_and_every_point_in_an_exhaustive_pass(tmp_path, capsys):
    from kvpipe.decide.limits import Limits
    from kvpipe.orchestrate.search.study import MEASURED, REUSED, Seen
    from kvpipe.orchestrate.search.sweeper import SearchSettings
    from kvpipe.orchestrate.search.trial_log import print_trial
    from kvpipe.orchestrate.search.trials import Search

    chat = SimpleNamespace(bound_workload=SimpleNamespace(metrics=[], quality=None))
    the_space = space()
    first, second = the_space.points[:2]

    def lines(trials):
        search = Search(SearchSettings(trials=trials), [], chat, the_space, Limits(), "cpu", None, tmp_path, tmp_path)
        for point, outcome in ((first, MEASURED), (second, REUSED)):
            search.seen[point] = Seen(outcome, [1e6, 5.0, 0.0], [-1.0])
            print_trial(search, point, search.seen[point])
        return capsys.readouterr().err.splitlines()

    measured, reused = lines(trials=7)
    assert measured.startswith("trial 1/7 measured: cache=dynamic") and "ETA" in measured
    assert reused.startswith("not counted, reused: cache=static")
    _, reused = lines(trials=len(the_space.points))
    assert reused.startswith(f"trial 2/{len(the_space.points)} reused: ")


def test_before_any_trial_is_feasible_each_candidate_gains_what_it_alone_dominates():
    """A batch asked before any trial met the limits: an empty front, and the candidate dominating
    more (fewer bytes, lower TPOT, lower KL) gains more."""
    import numpy as np

    empty_front = np.empty((0, 3))
    gains = hypervolume_gains(empty_front, np.array([[1.0, 2.0, 0.0], [2.0, 3.0, 0.1]]))
    assert gains[0] > gains[1] > 0
