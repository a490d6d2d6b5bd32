"""Quality references on disk: reused by a later process, recomputed when unusable, whole under
concurrent writers, bounded, and keyed by a fingerprint that changes with the weights."""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch

from kvpipe import disk_cache, model
from kvpipe.job.runner import run_job
from kvpipe.measure import quality
from kvpipe.model.fingerprint import fingerprint

from conftest import REPO, spec_for

TINY = ("model=tiny_random", "tracking=off", "workload.max_new_tokens=4", "workload.warmup=0",
        "workload.repeats=1", "quality.windows=2", "quality.scored_tokens=16")  # fmt: skip


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty reference folder, and no references in this process."""
    monkeypatch.setenv(disk_cache.FOLDER_ENV, str(tmp_path / "references"))
    monkeypatch.setattr(quality, "_REFERENCES", {})
    return tmp_path / "references"


def count_scoring(monkeypatch) -> list:
    rows = []
    original = quality.teacher_forced_rows
    monkeypatch.setattr(quality, "teacher_forced_rows", lambda *a, **k: rows.append(len(a[2])) or original(*a, **k))
    return rows


@pytest.mark.slow  # real jobs with their quality pass
def test_a_later_process_reuses_the_stored_references_and_scores_alike(store, monkeypatch):
    first = run_job(spec_for(*TINY, "cache=quantized", "axis=per_token")).metrics
    assert len(list(store.glob("*.pt"))) == 2  # the greedy tokens and the scored windows
    monkeypatch.setattr(quality, "_REFERENCES", {})  # as a new process starts
    rows = count_scoring(monkeypatch)
    second = run_job(spec_for(*TINY, "cache=quantized", "axis=per_token")).metrics
    assert rows == [2]  # only the cache under test was scored: the reference came from disk
    for name in ("kl_vs_reference", "token_agreement", "ppl", "first_divergence"):
        assert second[name] == pytest.approx(first[name], rel=1e-6, abs=1e-9)


@pytest.mark.slow  # real jobs with their quality pass
@pytest.mark.parametrize("damage", ["garbage", "truncated", "another key"])
def test_an_unusable_entry_is_recomputed_never_trusted(store, monkeypatch, damage):
    spec = spec_for(*TINY, "cache=static")
    run_job(spec)
    entries = sorted(store.glob("*.pt"))
    for path in entries:
        if damage == "garbage":
            path.write_bytes(b"not a torch file")
        elif damage == "truncated":
            path.write_bytes(path.read_bytes()[:100])
        else:
            torch.save({"format": disk_cache.FORMAT, "key": "something else", "value": [1]}, path)
    monkeypatch.setattr(quality, "_REFERENCES", {})
    rows = count_scoring(monkeypatch)
    run_job(spec)
    assert sum(rows) == 4  # the reference's 2 windows again, then the job's own 2
    assert all(disk_cache.load(key) is not None for key in _keys(spec))  # rewritten whole


def _keys(spec) -> list[str]:
    loaded = model.load(spec.model)
    workload = spec.bound_workload
    tokens = f"tokens of {quality.batches_digest(workload.batches(loaded.tokenizer, loaded.device))}"
    return [
        quality.disk_key(loaded, spec, quality.reference_key(loaded, spec, workload, w)) for w in (tokens, "windows")
    ]


@pytest.mark.slow  # a served job and a batch job with their quality passes
def test_a_served_jobs_reference_is_not_taken_for_a_batch_job_on_the_same_prompts(store):
    labelled = (*TINY, "workload=dataset", f"workload.path={REPO / 'examples' / 'questions.jsonl'}")
    served = run_job(spec_for(*labelled, "load=concurrency", "load.requests=2"))  # two of the file's prompts
    whole = run_job(spec_for(*labelled))
    assert len(served.scored.answers) == 2  # hence a reference for those two only
    assert len(whole.scored.answers) == len((REPO / "examples" / "questions.jsonl").read_text().splitlines())
    assert all(answer.reference_correct is not None for answer in whole.scored.answers)


def _writer(folder: str, key: str, seed: int) -> None:
    os.environ[disk_cache.FOLDER_ENV] = folder
    for _ in range(5):
        disk_cache.save(key, [torch.full((256, 1024), float(seed))])


@pytest.mark.slow  # starts two Python processes
def test_two_processes_writing_one_entry_leave_it_whole(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.FOLDER_ENV, str(tmp_path / "references"))
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_writer, args=(str(tmp_path / "references"), "same key", s)) for s in (1, 2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)  # a guard against a hang; both are done, however long they took
    assert [writer.exitcode for writer in writers] == [0, 0]
    value = disk_cache.load("same key")
    assert value is not None and value[0].unique().numel() == 1  # one writer's tensor, whole
    assert not list((tmp_path / "references").glob(".writing-*"))


def test_the_folder_is_kept_under_its_limit_least_recently_used_first(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.FOLDER_ENV, str(tmp_path / "references"))
    for name in ("a", "b", "c"):  # 256 KiB each, and a little
        disk_cache.save(name, [torch.zeros(64, 1024)])
        os.utime(disk_cache.path_for(name), (1, {"a": 100, "b": 200, "c": 300}[name]))
    disk_cache.load("a")  # used again: now the most recent
    monkeypatch.setenv(disk_cache.LIMIT_ENV, "0.6")  # room for two
    disk_cache.prune(disk_cache.limit_bytes())
    assert disk_cache.load("b") is None and disk_cache.load("a") is not None and disk_cache.load("c") is not None


def test_the_fingerprint_changes_with_the_weights_and_not_otherwise(tmp_path):
    from dataclasses import replace

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    weights = folder / "model.safetensors"
    weights.write_bytes(b"x" * 3_000_000)
    cfg = replace(spec_for("model=hf", f"model.name_or_path={folder}").model)
    before = fingerprint(cfg)
    assert fingerprint(cfg) == before
    weights.write_bytes(b"x" * 1_500_000 + b"y" + b"x" * 1_499_999)  # same size: the rewrite changes its time
    os.utime(weights, ns=(1, 1))
    assert fingerprint(cfg) != before
    random = spec_for("model=tiny_random").model
    assert fingerprint(random) != fingerprint(replace(random, seed=1))


@pytest.mark.slow  # builds and tokenizes the reference texts (~3 s)
def test_the_reference_texts_token_ids_are_stored_once_and_keyed_by_the_whole_tokenizer(store, monkeypatch):
    """long_context's and passkey's text, tokenized once per tokenizer on this machine: a later
    process reads the ids back (the same ids); a tokenizer that differs in anything gets its own;
    an entry that does not load is recomputed."""
    from transformers import AutoTokenizer

    from kvpipe.workload import _texts
    from kvpipe.workload._encoding import raw_ids

    fresh = lambda **kwargs: AutoTokenizer.from_pretrained(str(model.embedded_folder()), **kwargs)  # noqa: E731
    expected = raw_ids(fresh(), _texts.reference_text())
    assert _texts._reference_ids(fresh()) == expected and len(list(store.glob("*.pt"))) == 1
    tokenized = []
    monkeypatch.setattr(_texts, "raw_ids", lambda tok, text: tokenized.append(1) or raw_ids(tok, text))
    assert _texts._reference_ids(fresh()) == expected and tokenized == []  # a new tokenizer object: from disk
    other = fresh()
    other.add_tokens(["Python"])  # its pipeline differs: "Python" is one token now
    assert _texts._reference_ids(other) != expected and tokenized == [1]
    assert len(list(store.glob("*.pt"))) == 2
    for entry in store.glob("*.pt"):
        entry.write_bytes(b"half a file")
    assert _texts._reference_ids(fresh()) == expected and tokenized == [1, 1]
