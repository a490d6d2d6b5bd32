"""Every kvpipe command the README and the manual show still parses: a job's or a sweep's overrides
compose into a valid config (Hydra's composition, then kvpipe's validation), and a subcommand's
arguments pass its parser, and a press fits the prompts it would read. Nothing runs. A command shown with its one-line error (`kvpipe: error:`
right after it) must fail validation instead."""

from __future__ import annotations

import itertools

import pytest
from shown_commands import REPO, shown_commands, words_of

from kvpipe import cli
from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.jobspec import compose, make_spec

# Hydra's own flags: they say how to run, not what
HYDRA_FLAGS = {"-m", "--multirun", "--help", "-h", "--info"}
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "-sc", "--shell-completion", "--package", "-p", "--config-dir", "-cd"}
# Values that stand for the user's own files: a folder or file that exists on their machine, not here
PLACEHOLDERS = ("model.name_or_path", "workload.path", "workload.data_files")


def job_overrides(words: list[str]) -> list[list[str]]:
    """The overrides a job or sweep composes, one list per value of each swept key (every key at its
    first value but one), Hydra's flags left out."""
    overrides, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in HYDRA_FLAGS_WITH_VALUE:
            skip = True
        elif word not in HYDRA_FLAGS and not word.startswith("--"):
            overrides.append(word)
    swept = {
        i: _values(word.split("=", 1)[1])
        for i, word in enumerate(overrides)
        if "=" in word and _values(word.split("=", 1)[1])
    }
    first = [f"{w.split('=', 1)[0]}={swept[i][0]}" if i in swept else w for i, w in enumerate(overrides)]
    variants = [first]
    for i, values in swept.items():
        for value in values[1:]:
            variants.append([*first[:i], f"{overrides[i].split('=', 1)[0]}={value}", *first[i + 1 :]])
    return variants


def _values(value: str) -> list[str] | None:
    """A sweep's values (a,b,c outside brackets and quotes), or None for one value."""
    if value.startswith(("[", "{", "'", '"')) or "," not in value or "(" in value:
        return None
    return value.split(",")


CASES = shown_commands()


def test_the_docs_show_commands_of_every_kind():
    subcommands = {words_of(c)[0] for _, _, c, _ in CASES if words_of(c) and words_of(c)[0] in cli.subcommands()}
    assert {"compare", "recommend", "advise", "plan"} <= subcommands
    assert any(not words_of(c) or words_of(c)[0] not in cli.subcommands() for _, _, c, _ in CASES)


@pytest.mark.parametrize("page,line,command,fails", CASES, ids=[case.id for case in CASES])
def test_every_command_the_docs_show_parses(page, line, command, fails):  # fails: the error shown
    words = words_of(command)
    if words and words[0] in cli.subcommands():
        parser = cli.subcommand_parser(only=words[0])
        if fails:
            with pytest.raises(KvpipeError):
                parser.parse_args(words)
        else:
            parser.parse_known_args(words)  # `overrides` after --flags are the subcommand's own to read
        return
    if "--help" in words or "-h" in words or any(w.startswith("-sc") for w in words):
        return  # Hydra's help and shell completion: nothing to compose
    for overrides in job_overrides(words):
        if fails and any(o.split("=")[0] in PLACEHOLDERS for o in overrides):
            _validate(overrides)  # what fails is the user's own file, which is not here
        elif fails:
            with pytest.raises(KvpipeError):
                _validate(overrides)
        else:
            _validate(overrides)


def _validate(overrides: list[str]) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from kvpipe import config

    try:
        cfg = compose(overrides, with_hydra=any(o.lstrip("+").startswith("hydra") for o in overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise KvpipeError(config.from_hydra(exc) or str(exc)) from exc
    if "hydra" in cfg:
        from omegaconf import open_dict

        with open_dict(cfg):
            del cfg["hydra"]
    try:
        spec = make_spec(cfg, overrides)
    except ConfigError as exc:
        if exc.field not in PLACEHOLDERS:
            raise
        return
    if spec.press is not None:
        _check_prompts(spec)


def _check_prompts(spec) -> None:
    """A press against the prompts it would read, as a job checks it before the weights load: its
    window must fit the shortest (only the tokenizer is loaded)."""
    from kvpipe import model
    from kvpipe.workload.base import shortest_and_padded

    batches = spec.bound_workload.batches(model.load_tokenizer(spec.model), "cpu")
    spec.strategy.check_prompts(*shortest_and_padded(batches))


def test_every_page_of_the_manual_is_in_its_navigation():
    import yaml

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!python/name:", ""))["nav"]
    listed = {next(iter(item.values())) if isinstance(item, dict) else item for item in itertools.chain(nav)}
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").glob("*.md")}
    assert pages <= listed, f"pages missing from mkdocs.yml's nav: {sorted(pages - listed)}"
