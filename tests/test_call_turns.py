"""Interleaved sweeps take turns by measured call: every job makes call i in a counterbalanced order
before any makes call i + 1, a call taken while other processes held a core is left out of its job's
figures and of the pairs it is part of, runs pair call by call, and repeats=auto measures until the paired
ratios decide. The machine's load is an injected sampler here: no process is spun for a verdict."""

from __future__ import annotations

import math
import os
import time
from types import SimpleNamespace

import pytest

from kvpipe.decide import paired
from kvpipe.errors import ConfigError
from kvpipe.measure.contention import CpuSample, call_contended, cores, wait_for_quiet
from kvpipe.measure.round_figures import BATCH_FIGURES, call_tags, decided, firmness_note, mean, round_tags
from kvpipe.schedule import RoundTaker, check_turn, run_rounds

CALLS = ("short", "long", "short again", "long again")


class CallJob(RoundTaker):
    """A job of four calls a round whose TPOT for call c of round r is `tpot(r, c)`; every call it
    makes goes into `taken` (shared by the jobs of a test) as (label, call)."""

    calls_per_round = len(CALLS)

    def __init__(self, label, taken, repeats=3, tpot=lambda r, c: 10.0, max_repeats=30, within=0.03):
        timing = SimpleNamespace(repeats=repeats, target_interval=0.05, max_repeats=max_repeats,
                                 max_measure_s=600.0, decide_within=within)  # fmt: skip
        super().__init__(label, timing, BATCH_FIGURES)
        self.taken, self.tpot = taken, tpot

    def call_keys(self) -> list:
        return list(CALLS)

    def measure_call(self, index, advance):
        self.taken.append((self.label, index))
        value = self.tpot(self.rounds_done(), index)
        self.add_call({"ttft_ms": 1.0, "tpot_ms": value})
        advance()

    def close_round(self):  # over the round's calls not left out, as a batch job's
        self.add_round({"ttft_ms": 1.0, "tpot_ms": mean(self.paired_calls()["tpot_ms"][-len(CALLS) :]),
                        "decode_tokens_per_s": 100.0})  # fmt: skip

    def measure_round(self, advance):  # turn=pass: the whole pass is one turn
        for index in range(len(CALLS)):
            self.measure_call(index, advance)
        self.close_round()


class Machine:
    """A sampler whose other processes hold every core during the calls listed in `busy` (every job's
    call numbered from 0 in the order they were made), and none otherwise; each call lasts a second
    of its clock."""

    def __init__(self, busy=()):
        self.busy, self.samples = set(busy), 0
        self.wall = self.others = self.own = 0.0
        self.waits: list[int] = []  # the calls made before each wait for quiet

    def wait(self) -> tuple[float, bool]:
        """A wait for quiet: three seconds, after which the machine was quiet."""
        self.waits.append(self.samples // 2)
        return 3.0, True

    def __call__(self) -> CpuSample:
        call, after = divmod(self.samples, 2)
        self.samples += 1
        if after:
            self.wall += 1.0
            self.own += 1.0
            self.others += cores() if call in self.busy else 0.0
        return CpuSample(self.wall, self.own + self.others, self.own)


def test_every_job_makes_each_call_before_any_makes_the_next_in_an_abba_order():
    taken = []
    jobs = [CallJob(f"#{i}", taken, repeats=2) for i in range(2)]
    rounds = run_rounds(jobs, seed=3, shuffle=True, turn="call", sampler=Machine())
    turns = [taken[i : i + 2] for i in range(0, len(taken), 2)]
    assert [sorted(turn) for turn in turns] == [[("#0", c), ("#1", c)] for _ in range(2) for c in range(4)]
    orders = [order for round_orders in rounds.call_orders for order in round_orders]
    assert all(orders[i + 1] == orders[i][::-1] for i in range(0, len(orders), 2))  # each order, then its reverse
    assert [order[0] for order in orders].count(0) == 4  # each job first in 4 of the 8 turns
    again = run_rounds([CallJob(f"#{i}", [], repeats=2) for i in range(2)], 3, True, turn="call", sampler=Machine())
    assert again.call_orders == rounds.call_orders  # the seed decides


def test_whole_pass_turns_remain_a_setting():
    taken = []
    jobs = [CallJob(f"#{i}", taken, repeats=1) for i in range(2)]
    rounds = run_rounds(jobs, seed=0, shuffle=True, turn="pass")
    first = rounds.orders[0][0]
    assert [label for label, _ in taken] == [f"#{first}"] * 4 + [f"#{1 - first}"] * 4
    assert not rounds.call_orders and jobs[0].turn == "pass"
    assert check_turn("pass") == "pass"
    with pytest.raises(ConfigError, match=r"hydra.launcher.turn='abba' .*call, pass"):
        check_turn("abba")


def test_a_call_under_other_processes_load_is_left_out_of_its_job_and_its_pairs_alone():
    # a neighbour that came for one job's call and left before the other's: only that call is out
    taken = []
    jobs = [CallJob(f"#{i}", taken, repeats=2, tpot=lambda r, c: 10.0 + c) for i in range(2)]
    machine = Machine(busy={2, 13})
    rounds = run_rounds(jobs, seed=0, shuffle=True, turn="call", sampler=machine, wait=machine.wait)
    hit = [(int(taken[n][0][1:]), taken[n][1]) for n in (2, 13)]  # (job, call) of the 3rd and 14th calls made
    assert hit[0][1] == 1 and hit[1][1] == 2
    assert rounds.excluded == [[[1, hit[0][0]]], [[2, hit[1][0]]]]
    assert rounds.to_dict(["#0", "#1"])["excluded_calls"] == rounds.excluded
    held = rounds.to_dict(["#0", "#1"])["call_other_cores"]  # per round and call, in the call's order
    assert held[0][1][0] == cores() and held[1][2][1] == cores() and sum(map(sum, held[0] + held[1])) == 2 * cores()
    for index, job in enumerate(jobs):
        left_out = [4 * r + call for r, (j, call) in enumerate(hit) if j == index]
        assert job.excluded_calls == len(left_out)
        assert [i for i, v in enumerate(job.paired_calls()["tpot_ms"]) if math.isnan(v)] == left_out
    assert paired_calls_kept(jobs[1], jobs[0]) == 6  # each left-out call takes its pair with it
    assert machine.waits == [4, 14]  # the turn after each that left a call out waited for quiet first
    assert rounds.waited_s == [3.0, 3.0] and rounds.to_dict(["#0", "#1"])["quiet_wait_s"] == [3.0, 3.0]


def paired_calls_kept(job, baseline) -> int:
    both = zip(job.paired_calls()["tpot_ms"], baseline.paired_calls()["tpot_ms"])
    return sum(1 for a, b in both if not (math.isnan(a) or math.isnan(b)))


def test_a_steady_neighbour_crowds_both_calls_of_every_pair_alike_and_every_pair_is_kept():
    # other processes hold every core through every call: each turn's calls saw the same machine
    waits = []
    jobs = [CallJob(f"#{i}", [], repeats=2, tpot=lambda r, c: 10.0 + c) for i in range(2)]
    rounds = run_rounds(jobs, seed=0, shuffle=True, turn="call", sampler=Machine(busy=range(16)), wait=waits.append)
    assert rounds.excluded == [[], []] and not waits  # nothing left out, nothing waited for
    assert jobs[0].excluded_calls == 0 and jobs[0].paired_calls()["tpot_ms"] == [10.0, 11.0, 12.0, 13.0] * 2
    assert all(held == [cores(), cores()] for one_round in rounds.other_cores for held in one_round)  # recorded
    from kvpipe.schedule import paired as paired_ratio

    assert paired_ratio(jobs[1], jobs[0])[0] == pytest.approx(1.0)


def test_where_one_partner_lacked_cores_the_other_did_not_its_call_is_out_however_busy_the_turn():
    # a 2-thread job beside a neighbour that took one core for one call and every core for its partner's
    class Halves(Machine):
        def __call__(self):
            call, after = divmod(self.samples, 2)
            self.samples += 1
            if after:
                self.wall, self.own = self.wall + 1.0, self.own + 1.0
                self.others += cores() if call % 2 else cores() / 2
            return CpuSample(self.wall, self.own + self.others, self.own)

    jobs = [CallJob(f"#{i}", [], repeats=1) for i in range(2)]
    for job in jobs:
        job.threads = cores()
    rounds = run_rounds(jobs, seed=0, shuffle=True, turn="call", sampler=Halves(), wait=lambda: (0.0, True))
    second = [order[1] for order in rounds.call_orders[0]]  # each turn's second call: the one that lacked more
    assert rounds.excluded == [[[call, job] for call, job in enumerate(second)]]


def test_a_neighbour_that_stays_ends_the_waiting_for_quiet():
    waits = []

    def still_busy():
        waits.append(1)
        return 20.0, False

    # it arrives during the second turn's second call and stays: that call is out, and the wait for quiet
    # runs out; then it crowds every call alike, and they count
    jobs = [CallJob(f"#{i}", [], repeats=2) for i in range(2)]
    rounds = run_rounds(jobs, seed=0, shuffle=True, turn="call", sampler=Machine(busy=range(3, 16)), wait=still_busy)
    assert len(waits) == 1 and rounds.waited_s == [20.0, 0.0]  # one wait ran out: the rest measure on
    assert [len(excluded) for excluded in rounds.excluded] == [1, 0]


def test_waiting_for_quiet_reads_the_machine_window_by_window():
    # others hold a core for two windows, then an idle machine's hundredth of a core
    held = iter([1.0, 1.0, 0.01])
    state = {"wall": 0.0, "others": 0.0}

    def sampler():
        return CpuSample(state["wall"], state["others"], 0.0)

    def sleep(seconds):
        state["wall"] += seconds
        state["others"] += next(held) * seconds

    assert wait_for_quiet(sampler, sleep, window_s=1.0, most_s=20.0) == (3.0, True)
    state["others"] = 0.0
    held = iter([1.0] * 10)
    assert wait_for_quiet(sampler, sleep, window_s=1.0, most_s=4.0) == (4.0, False)  # still busy: it gives up
    no_accounting = CpuSample(0.0, math.nan, 0.0)
    assert wait_for_quiet(lambda: no_accounting, lambda s: None) == (0.0, True)  # cannot tell: no wait


def test_a_call_is_contended_by_judges_rule_with_a_twentieth_of_a_core_of_slack():
    quiet, start, every = CpuSample(1.0, 1.0, 1.0), CpuSample(0.0, 0.0, 0.0), cores()
    assert not call_contended(start, quiet, threads=1, on_cpu=True)
    assert call_contended(start, CpuSample(1.0, 1.0 + every, 1.0), threads=1, on_cpu=True)  # every core held
    assert call_contended(start, CpuSample(1.0, 1.0, 0.4), threads=1, on_cpu=True)  # lost its core to 0.6 others
    assert not call_contended(start, CpuSample(1.0, 1.0, 0.4), threads=1, on_cpu=False)
    # threads on every core: a tenth of a core held by others for the call is contention, a fiftieth is not
    assert call_contended(start, CpuSample(1.0, every + 0.1, every), threads=every, on_cpu=True)
    assert not call_contended(start, CpuSample(1.0, every + 0.02, every), threads=every, on_cpu=True)


def test_a_short_call_is_not_contended_by_the_accountings_rounding_but_is_by_a_neighbour():
    # A tiny model's call lasts 0.15 s; the kernel counts CPU time in ticks of 1/100 s, so an idle
    # machine reads 2-3 ticks of "others" over such a call (0.13-0.2 cores): not a neighbour
    start, every, tick = CpuSample(0.0, 0.0, 0.0), cores(), 1 / os.sysconf("SC_CLK_TCK")
    rounded = CpuSample(0.15, every * 0.15 + 3 * tick, every * 0.15)
    assert not call_contended(start, rounded, threads=every, on_cpu=True)
    neighbour = CpuSample(0.15, every * 0.15 + 0.15, every * 0.15)  # one core held through the call
    assert call_contended(start, neighbour, threads=every, on_cpu=True)


def test_repeats_auto_stops_once_every_paired_ratio_decides():
    steady = [CallJob(f"#{i}", [], repeats="auto", tpot=lambda r, c: 10.0 + c + 0.001 * (r % 2)) for i in range(2)]
    run_rounds(steady, seed=0, shuffle=True, turn="call", sampler=Machine())
    assert [job.rounds_done() for job in steady] == [3, 3] and {job.stopped_by for job in steady} == {"decided"}
    slower = [CallJob("#0", [], repeats="auto", tpot=lambda r, c: 10.0 + c + (r % 3))]
    slower.append(CallJob("#1", [], repeats="auto", tpot=lambda r, c: 1.5 * (10.0 + c + (r % 3))))
    run_rounds(slower, seed=0, shuffle=True, turn="call", sampler=Machine())
    assert slower[1].rounds_done() == 3 and slower[1].stopped_by == "decided"  # clear: 1.5× in every pair


def test_repeats_auto_goes_on_to_its_cap_while_a_ratio_is_undecided():
    wobbly = [CallJob("#0", [], repeats="auto", max_repeats=5)]
    wobbly.append(CallJob("#1", [], repeats="auto", max_repeats=5, tpot=lambda r, c: 10.0 * (1.3 if c % 2 else 0.75)))
    rounds = run_rounds(wobbly, seed=0, shuffle=True, turn="call", sampler=Machine())
    assert len(rounds.seconds) == 5 and rounds.stopped_by == "max_repeats"
    assert rounds.to_dict(["#0", "#1"])["stopped_by"] == "max_repeats"


@pytest.mark.parametrize("turn", ["call", "pass"])
def test_max_measure_s_caps_every_jobs_measured_seconds_together_under_either_rule(turn, monkeypatch):
    # a clock that moves 0.5 s each time it is read: every turn (a call, or a whole pass) measures 0.5 s
    clock = iter(range(100_000))
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock) / 2)
    # neither rule ever settles: each job's rounds and their ratio swing between 0.75x and 1.3x
    wobbly = [CallJob(f"#{i}", [], repeats="auto", tpot=lambda r, c, i=i: 10.0 * (1.3 if (r + i) % 2 else 0.75))
              for i in range(2)]  # fmt: skip
    for job in wobbly:
        job.timing.max_measure_s = 20.0
    rounds = run_rounds(wobbly, seed=0, shuffle=True, turn=turn, sampler=Machine(), quiet_wait_s=0)
    # 20 s of both jobs' turns: by call, 5 rounds of 2 x 4 calls; by pass, 20 rounds of 2 passes
    assert len(rounds.seconds) == (5 if turn == "call" else 20)
    assert rounds.stopped_by == ("max_measure_s" if turn == "call" else None)  # by pass: each job's own rule


@pytest.mark.parametrize(
    "low, high, settled",
    [(0.99, 1.01, True), (1.05, 1.40, True), (0.60, 0.95, True), (0.95, 1.10, False), (math.nan, math.nan, False)],
)
def test_a_ratio_is_decided_within_three_percent_or_clear_of_the_band(low, high, settled):
    assert decided(1.0, low, high, within=0.03) is settled


def rows(first: list[float], second: list[float], keys=("a", "a"), per_round=4) -> tuple[dict, dict]:
    """Two runs' rows (as kvpipe.decide.runs reads them) that took turns call by call."""
    made = []
    for calls, key in zip((first, second), keys):
        rounds = [mean(calls[i : i + per_round]) for i in range(0, len(calls), per_round)]
        tags = {**round_tags({"tpot_ms": rounds}), **call_tags({"tpot_ms": calls, "ttft_ms": calls}, [key])}
        tags["round_group"] = "g"
        made.append({f"tags.kvpipe.{name}": value for name, value in tags.items()})
    return made[0], made[1]


def test_runs_that_took_the_same_calls_pair_call_by_call():
    # the machine's speed changes call to call; each call's turn is shared by both runs
    speed = [1 + 0.3 * math.sin(i) for i in range(12)]
    base = [10 * s for s in speed]
    run, baseline = rows([v * 1.1 * (1 + 0.002 * (i % 3)) for i, v in enumerate(base)], base)
    by_call = paired.ratio(run, baseline)
    assert by_call.paired and by_call.rounds == 12 and by_call.calls_per_round == 4
    assert by_call.clear and 1.09 < by_call.value < 1.11 and by_call.high - by_call.low < 0.01
    run, baseline = rows([v * 1.1 for v in base], base, keys=("a", "other prompts"))
    assert paired.ratio(run, baseline).rounds == 3  # different calls: round by round


def test_calls_left_out_are_out_of_both_runs_of_a_pair():
    base = [10.0, math.nan, 10.2, 9.9, 10.1, 10.0, math.nan, 10.0]
    run, baseline = rows([v * 1.5 if v == v else 30.0 for v in base], base)
    assert paired.ratio(run, baseline).rounds == 6 and paired.ratio(run, baseline).value == pytest.approx(1.5)


def test_a_call_series_too_long_for_a_tag_is_left_to_the_rounds():
    assert call_tags({"tpot_ms": [12.3456] * 2000, "ttft_ms": [1.0] * 2000}, ["a"]) == {}


def test_a_jobs_own_figure_less_firm_than_its_ratio_says_so():
    note = firmness_note([10.0, 14.0, 8.0], (1.01, 0.99, 1.03), "#0")
    assert note.startswith("TPOT against #0, paired call by call in the same turns: 1.010× (0.990–1.030), firmer than")
    assert firmness_note([10.0, 10.01, 9.99], (1.0, 0.8, 1.25), "#0") is None


def test_decide_within_is_checked_and_leaves_keys_and_params_alone_at_its_default():
    from kvpipe.jobspec import spec_from

    auto = ("model=tiny_random", "workload.repeats=auto")
    plain, explicit = spec_from([*auto]), spec_from([*auto, "workload.decide_within=0.03"])
    assert plain.measurement_key() == explicit.measurement_key() and plain.params() == explicit.params()
    assert spec_from([*auto, "workload.decide_within=0.05"]).params()["workload.decide_within"] == "0.05"
    with pytest.raises(ConfigError, match=r"workload.decide_within=2"):
        spec_from([*auto, "workload.decide_within=2"])


@pytest.mark.slow  # two real jobs of the tiny random model, in this process
def test_a_sweeps_jobs_read_their_figures_from_the_turns_no_other_process_slowed():
    from kvpipe.job.runner import job_for

    from conftest import spec_for

    jobs = []
    for seed in (0, 1):
        job = job_for(spec_for("model=tiny_random", "workload.max_new_tokens=6", "tracking=off", "quality=off",
                               f"workload.seed={seed}", "workload.repeats=2"))  # fmt: skip
        job.label = f"#{seed}"
        job.prepare()
        jobs.append(job)
    machine = Machine(busy={0, 5})  # calls of turns 1 and 3
    run_rounds(jobs, seed=0, shuffle=True, turn="call", sampler=machine, wait=machine.wait)
    results = [job.result({"round_group": "g"}) for job in jobs]
    assert sum(result.metrics["calls_excluded"] for result in results) == 2
    for job, result in zip(jobs, results):
        kept = [c.timing.tpot_ms for c, keep in zip(job.calls, job.kept) if keep]
        # the mean of each round's mean over its kept calls: the figure its interval is read around
        rounds = [
            [c.timing.tpot_ms for c, keep in zip(job.calls[i : i + 4], job.kept[i : i + 4]) if keep]
            for i in range(0, len(job.calls), 4)
        ]
        by_round = [sum(r) / len(r) for r in rounds if r]
        assert result.metrics["tpot_ms"] == pytest.approx(sum(by_round) / len(by_round))
        left_out = 8 - len(kept)
        if left_out:
            assert any(note.startswith(f"{left_out} of 8 calls ran while other processes held a core")
                       for note in result.notes)  # fmt: skip
    rows = [{f"tags.kvpipe.{k}": v for k, v in result.tags.items()} for result in results]
    found = paired.ratio(rows[1], rows[0])
    assert (
        found.paired and found.rounds == 6 and found.calls_per_round == 4
    )  # call by call, each left-out call's pair out


def test_the_sweeps_ratios_are_against_the_job_compare_weighs_them_against():
    jobs = [CallJob("#0", [], repeats="auto", max_repeats=4, tpot=lambda r, c: 10.0 * (1.3 if c % 2 else 0.75))]
    jobs += [CallJob(f"#{i}", [], repeats="auto", max_repeats=4) for i in (1, 2)]
    jobs[1].compare_baseline = True  # the dynamic cache, second in the sweep: #2 against it decides at once
    rounds = run_rounds(jobs, seed=0, shuffle=True, turn="call", sampler=Machine())
    assert rounds.stopped_by == "max_repeats"  # #0 against #1 never decides
    steady = run_rounds([CallJob(j.label, [], repeats="auto") for j in jobs], 0, True, turn="call", sampler=Machine())
    assert steady.stopped_by == "decided" and len(steady.seconds) == 3
