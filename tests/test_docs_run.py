"""The manual, run as written: every `python -m kvpipe …` and `kvpipe …` line of the README and
docs/*.md runs here on the tiny model, each page's in page order against a store of its own, so a
`compare` or `recommend` finds the sweeps the page showed before it. Every command is shrunk the
same way (`shrunk`): the tiny model (an engine's server: the embedded model's own file); one round,
one thread, no warm-up call and eight tokens of one window scored for quality unless it sets them; at
most two new tokens and one prompt per cell (RULER's samples, passkey's trials; four rows of a
dataset) even where it or its workload sets more (RULER's examples ask 64 tokens of two samples); two
rounds at most on repeats=auto; three advise trials, two requests per capacity point and a search's
resolution of 50%; at most six
requests per load and a ramp of 2 s, a conversation's user thinking 0.05 s between turns (what waits
in real time); what it says stays. A command shown with its `kvpipe: error:` must fail with that
error; every other one must exit 0 and warn of no setting it did not give. A command shown again,
shrunk alike, runs where it is shown first, unless a compare or recommend after it on its page reads
what it makes (`shown_before`).

A page's commands run on one xdist worker, in page order; the pages spread over the workers. Where
the time goes: `make test-census` (tests/census.py)."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest
from shown_commands import REPO, Shown, shown_commands, words_of

from kvpipe import cli
from kvpipe.jobspec.validated import override_key

from conftest import kvpipe_here, run_cli

pytestmark = pytest.mark.slow

CASES = shown_commands()

# What the tiny model needs to run what the embedded one does: context_scaling's 8,000-token prompts
MODEL = ("model=tiny_random", "model.max_position_embeddings=8192")
# The smallest run that still measures, for every command that runs a model
# (quality's teacher-forced tokens over one window, not four: a quantized cache's default, residual_length
# + 32, is most of a tiny job; no warm-up call, which a command's meaning never needs)
RUN = ("model.threads=1", "workload.max_new_tokens=2", "workload.repeats=1", "workload.warmup=0")
RUN += ("quality.scored_tokens=8", "quality.windows=1")
# A search's or a load's size: at most this many of each; and what a command sets that its meaning does
# not need at full size: answers of two tokens (RULER's examples ask 64), one sample of each task. A load
# at a rate waits for its arrivals in real time (16 requests at 2/s: 8 s of a worker doing nothing):
# six requests, and a ramp of at most 2 s, which still ends before the last of them arrives
AT_MOST = {
    "--requests": 2,
    "load.requests": 6,
    "load.ramp_up_s": 2,
    "hydra.sweeper.trials": 3,
    "workload.max_new_tokens": 2,
    "workload.samples": 1,
    "workload.trials": 1,
}
# A search's resolution, at least this coarse: a capacity search at 10% visits a rate point per step
# near its answer, and through vLLM each point is a server's start (~30 s); at 50% it still finds a rate
AT_LEAST = {"--resolution": 0.5}
# Prompts per cell, where a workload draws several (RULER's samples per task and length, passkey's
# trials per length and depth): one, whether the command sets them or its workload's defaults do; a
# file of the user's rows: a seeded sample of four (examples/questions.jsonl holds 28)
PER_CELL = {"ruler": "workload.samples=1", "passkey": "workload.trials=1", "dataset": "workload.limit=4"}
# What a workload waits in real time: a conversation's user thinks 1 s before each next turn (3 s a session)
WAITS = {"conversation": "workload.think_time_s=0.05"}
# A command on repeats=auto measures until its figures settle, up to 30 rounds: its rule runs in two
AUTO_AT_MOST = "workload.max_repeats=2"
# advise's --trials counts configurations, each a whole job; capacity's counts rate points, which
# --requests keeps short, and its search stops where it converges (6 points on the tiny model)
TRIALS = {"advise": 3}
# Settings whose value is a file or store of the user's, which is not in this repository
USERS_OWN = ("model.name_or_path", "workload.path", "workload.data_files", "tracking.uri", "engine.base_url")
# The user's own files a page shows refused, written as the page describes them
SHOWN_FILES = {
    "prompts.jsonl": '{"prompt": "Hello", "max_new_tokens": 4}\n',
    "broken.jsonl": '{"prompt": "Hello"}\n{"prompt": "a" "b"}\n',
}
NOT_HERE = {  # what no CI machine has
    "docs/scale-out.md:87": "a Slurm cluster and an MLflow server",
}
# Limits the tiny model cannot meet: there the command answers that no run meets them (exit 1)
CANNOT_MEET = {"--min-accuracy": "tiny_random's random weights answer nothing right"}
# A command that measures runs and holds their peak memory to a limit runs in a process of its own, as
# a user's does: in a test worker the process's peak counts the other tests' models and buffers too
MEASURED_AGAINST_MEMORY = ("advise", "capacity")
# The subcommands that read a page's runs rather than make them
READERS = ("compare", "recommend")
IGNORED = re.compile(r"\b([a-z_]+\.[a-z_.]+)(?:=\S*)? (?:is ignored|was not used|is not used)")


def shrunk(words: list[str]) -> list[str]:
    """The command at its smallest, the same for every command: the tiny model for every model it
    names or runs, RUN's settings where it runs one (unless it sets them), AT_MOST's caps."""
    subcommand = words[0] if words and words[0] in cli.subcommands() else None
    if subcommand in ("compare", "recommend"):
        return words  # they read runs: nothing to shrink
    at_most = {**AT_MOST, **({"--trials": TRIALS[subcommand]} if subcommand in TRIALS else {})}
    served_by_engine = any(w.startswith("engine=") and w != "engine=transformers" for w in words)
    out = ["model=tiny_random" if w.startswith("model=") and not served_by_engine else w for w in words]
    for index, word in enumerate(out):
        flag, _, value = word.partition("=")
        if word in at_most and index + 1 < len(out):
            out[index + 1] = str(min(int(out[index + 1]), at_most[word]))
        elif word in AT_LEAST and index + 1 < len(out):
            out[index + 1] = str(max(float(out[index + 1]), AT_LEAST[word]))
        elif flag in at_most and value.isdigit():
            out[index] = f"{flag}={min(int(value), at_most[flag])}"
    given = {override_key(w) for w in out}
    model = () if served_by_engine else MODEL  # an engine's server loads the embedded model's own file
    added = [w for w in (*model, *([] if subcommand == "plan" else RUN)) if override_key(w) not in given]
    for shrinks in (PER_CELL, WAITS):
        smaller = shrinks.get(workload_of(out), "")
        if smaller and subcommand != "plan" and override_key(smaller) not in given:
            added.append(smaller)
    if "workload.repeats=auto" in out and "workload.max_repeats" not in given:
        added.append(AUTO_AT_MOST)  # rounds until the figures settle: two are enough to run the rule
    if subcommand is not None:
        parser = argparse.ArgumentParser()
        importlib.import_module(f"kvpipe.commands.{subcommand}").add_arguments(parser)
        flags = {option for action in parser._actions for option in action.option_strings}
        added += [w for flag, n in at_most.items() if flag in flags and flag not in out for w in (flag, str(n))]
        added += [w for flag, n in AT_LEAST.items() if flag in flags and flag not in out for w in (flag, str(n))]
    return out + added


def words_shown(shown: Shown) -> list[str]:
    return words_of(re.sub(r"\s\[-[^\]]*\]", "", shown.command))  # `[--flag N]`: an optional one


def reads_runs(words: list[str]) -> bool:
    return bool(words) and words[0] in READERS


def shown_before() -> dict[str, str]:
    """A command that a page shows again as an earlier page (or line) showed it, shrunk alike: where it
    was shown first, for each later showing that nothing after it on its page reads (compare and
    recommend read the page's runs, so a showing before one of them still runs). The command is the
    same, so what it checks is checked once; compare and recommend themselves read each page's own
    store and always run."""
    said = [words_shown(shown) for shown in CASES]
    last_read = {shown.page: index for index, (shown, words) in enumerate(zip(CASES, said)) if reads_runs(words)}
    first, again = {}, {}
    for index, (shown, words) in enumerate(zip(CASES, said)):
        if reads_runs(words) or shown.error or shown.id in NOT_HERE or users_own(words):
            continue
        same = first.setdefault(tuple(shrunk(words)), shown.id)
        if same != shown.id and index > last_read.get(shown.page, -1):
            again[shown.id] = same
    return again


def workload_of(words: list[str]) -> str | None:
    """The one workload a command runs, as it names it or as the preset it names does."""
    for word in words:
        key, _, value = word.partition("=")
        if key == "workload":
            return value
        preset = REPO / "conf" / "experiment" / f"{value}.yaml"
        if key == "+experiment" and preset.exists():
            named = re.search(r"override /workload: (\w+)", preset.read_text())
            return named.group(1) if named else None
    return None


def engine_missing(words: list[str]) -> str | None:
    """Why an engine the command names cannot start here (its server is not built), or None."""
    from kvpipe.engine import get
    from kvpipe.jobspec.schema import option_schema

    for word in words:
        key, _, value = word.partition("=")
        if key == "engine" and value != "transformers":
            engine = get(value)
            return engine(option_schema(engine)()).missing()
    return None


def users_own(words: list[str]) -> str | None:
    for word in words:
        key, _, value = word.partition("=")
        path = value.removeprefix("sqlite:///")
        if key in USERS_OWN and path not in SHOWN_FILES and not (REPO / path).exists():
            return f"{key}={value} is the user's own"
    return None


@pytest.fixture(scope="module")
def page_dirs(tmp_path_factory, existing_store):
    """One folder per page (its outputs/ and MLflow store, migrated already: MLflow making a store is
    test_pipeline's first run), with the repository's examples."""
    made = {}

    def page_dir(page: str):
        if page not in made:
            made[page] = tmp_path_factory.mktemp(page.replace("/", "_"))
            existing_store(made[page])
            (made[page] / "examples").symlink_to(REPO / "examples")
            for name, text in SHOWN_FILES.items():
                (made[page] / name).write_text(text)
        return made[page]

    return page_dir


SHOWN_BEFORE = shown_before()


# A page's commands run in its order on one worker (a compare finds the sweeps shown before it); the
# pages spread over the workers
@pytest.mark.parametrize(
    "shown",
    [pytest.param(c, marks=pytest.mark.xdist_group(f"docs:{c.page}")) for c in CASES],
    ids=[c.id for c in CASES],
)
def test_every_command_the_docs_show_runs_as_they_say(shown, page_dirs, monkeypatch):
    words = words_shown(shown)
    if shown.id in NOT_HERE:
        pytest.skip(NOT_HERE[shown.id])
    if shown.id in SHOWN_BEFORE:
        pytest.skip(f"the same command as {SHOWN_BEFORE[shown.id]}, which runs it")
    if reason := users_own(words):
        pytest.skip(reason)
    if reason := engine_missing(words):
        pytest.skip(reason)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = shrunk(words)
    own_process = args[0] in MEASURED_AGAINST_MEMORY and "--memory-budget" in args
    page_dir = page_dirs(shown.page)
    done = run_cli(args, page_dir, timeout=600, process=True) if own_process else kvpipe_here(args, page_dir)
    said = done.stdout + done.stderr
    if shown.error:
        assert done.returncode != 0, f"kvpipe {' '.join(args)} ran; the docs show it refused"
        assert f"kvpipe: error: {shown.error[:50]}" in said, said[-2000:]
        return
    # a limit the tiny model cannot meet: an answer, not a failure, says that no run meets it
    if any(w in CANNOT_MEET for w in words) and done.returncode == 1:
        answered = ("no measured run meets the limits", "no cache meets")  # recommend's and advise's; capacity's
        assert any(words in said for words in answered) and "Traceback" not in said, said[-3000:]
    else:
        assert done.returncode == 0, f"kvpipe {' '.join(args)} exited {done.returncode}:\n{said[-3000:]}"
    given = {override_key(w) for w in args}
    unasked = [m.group(0) for m in IGNORED.finditer(said) if m.group(1) not in given]
    assert not unasked, f"kvpipe {' '.join(args)} warns of settings it did not give: {unasked}"
