"""workload=conversation, without serving it: what a turn sends (the history with the model's own
answers, through the chat template or as plain text, BOS once), when turns arrive (a think time after
the previous answer; the load starting sessions), and the door's refusals: a file whose rows are not
multi-turn messages, no load, a kept session cache on a strategy that cannot continue one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_prompts_as_the_model_expects import BOS, PLAIN_TEMPLATE, build_tokenizer, leading_bos

from kvpipe.errors import ConfigError
from kvpipe.job.session_turns import SessionTurns
from kvpipe.workload.conversation.sessions import Session

from conftest import TINY, run_cli, spec_for

SESSIONS = (*TINY, "workload=conversation", "load=concurrency")


def write_rows(folder, rows: list) -> str:
    path = folder / "talks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def nothing_recorded(folder) -> bool:
    """No result.json and no MLflow store (Hydra's own log of the refused config is all there is)."""
    return not list(folder.rglob("result.json")) and not (folder / "outputs" / "mlflow.db").exists()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


# ---- what a turn sends -------------------------------------------------------------------------


def test_a_turn_sends_the_system_prompt_every_earlier_question_with_its_answer_then_its_own():
    session = Session(0, "be brief", ("q1", "q2", "q3"))
    assert session.messages(2, ["a1", "a2"]) == [
        {"role": "system", "content": "be brief"}, user("q1"), {"role": "assistant", "content": "a1"},
        user("q2"), {"role": "assistant", "content": "a2"}, user("q3"),
    ]  # fmt: skip
    assert session.messages(0, []) == [{"role": "system", "content": "be brief"}, user("q1")]


def test_without_a_chat_template_turns_are_plain_role_paragraphs_with_bos_once():
    workload = spec_for(*SESSIONS, "workload.system_prompt=hello").bound_workload
    session = Session(0, "hello", ("what is the pass key ?", "and the number ?"))
    tokenizer = build_tokenizer(adds_bos=True)
    ids = workload.turn_ids(tokenizer, session, 1, ["the answer"])
    assert leading_bos(ids) == 1 and BOS not in ids[1:]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    said = [word for word in text.split() if word != ":"]  # the roles' names are not in its vocabulary
    assert said == "hello what is the pass key ? the answer and the number ?".split()  # in that order
    from kvpipe.workload.conversation import plain_text

    assert plain_text(session.messages(1, ["the answer"])).endswith("User: and the number ?\n\nAssistant:")


def test_through_a_template_without_bos_a_turn_gets_none():
    workload = spec_for(*SESSIONS).bound_workload
    tokenizer = build_tokenizer(adds_bos=False, template=PLAIN_TEMPLATE)
    ids = workload.turn_ids(tokenizer, Session(0, "", ("hello", "world")), 1, ["python"])
    assert leading_bos(ids) == 0
    assert tokenizer.decode(ids).split() == "user : hello user : python user : world assistant :".split()


def test_bundled_sessions_ask_about_their_own_passage_and_share_the_system_prompt():
    workload = spec_for(*SESSIONS, "workload.sessions=3", "workload.turns=5").bound_workload
    sessions = workload.sessions()
    assert len(sessions) == 3 and all(len(s.questions) == 5 for s in sessions)
    assert len({s.questions[0] for s in sessions}) == 3 and len({s.system for s in sessions}) == 1
    assert len(set(sessions[0].questions[1:])) == 4  # its follow-ups differ


def test_a_file_row_is_a_session_of_its_user_messages_its_assistant_messages_set_aside(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "own"}, user("one"), {"role": "assistant", "content": "x"},
                          user("two"), user("three")]}, {"messages": [user("a"), user("b")]}]  # fmt: skip
    path = write_rows(tmp_path, rows)
    sessions = spec_for(*SESSIONS, f"workload.path={path}", "workload.turns=2").bound_workload.sessions()
    assert [(s.system, s.questions) for s in sessions][0] == ("own", ("one", "two"))
    assert sessions[1].questions == ("a", "b") and sessions[1].system.startswith("You are")


# ---- when turns arrive -------------------------------------------------------------------------


def queue_of(count: int, turns: int, cap: int, closed: bool, think: float = 0.5, offsets=None) -> SessionTurns:
    sessions = [Session(n, "", tuple(f"q{t}" for t in range(turns))) for n in range(count)]

    def render(session, turn, answers, last, position):
        return SimpleNamespace(ids=[position, turn], session=position, last_turn=last)

    queue = SessionTurns(sessions, offsets or [0.0] * count, cap, closed, think, render, 10, 4)
    queue.begin(0.0)
    return queue


def test_a_turn_arrives_a_think_time_after_its_previous_answer_never_before():
    queue = queue_of(count=1, turns=3, cap=1, closed=True)
    (first,) = queue.take(0.0, room=4)
    queue.answered(first.index, 2.0, [7])
    assert queue.take(2.49, room=4) == [] and queue.next_s() == 2.5
    (second,) = queue.take(2.5, room=4)
    assert second.arrival_s == 2.5 and queue.turn_of[second.index] == (0, 1)


def test_a_closed_loop_starts_a_session_when_one_ends_and_an_open_one_at_its_arrival():
    closed = queue_of(count=3, turns=2, cap=2, closed=True)
    assert [a.request.ids for a in closed.take(0.0, room=8)] == [[0, 0], [1, 0]]  # two sessions in flight
    closed.answered(0, 1.0, [1])
    assert closed.take(1.2, room=8) == []  # session 0 thinks; session 2 waits for a place
    (turn,) = closed.take(1.5, room=8)
    closed.answered(turn.index, 2.0, [1])  # session 0 done at 2.0: session 2 starts then
    (started,) = closed.take(2.0, room=8)
    assert started.request.ids == [2, 0] and started.arrival_s == 2.0
    opened = queue_of(count=2, turns=1, cap=2, closed=False, offsets=[0.0, 3.0])
    assert len(opened.take(1.0, room=8)) == 1 and opened.next_s() == 3.0


def test_a_turns_prompt_longer_than_the_caches_were_sized_for_is_a_bug_said_as_such():
    queue = queue_of(count=1, turns=2, cap=1, closed=True)
    queue.max_prompt_tokens = 1
    with pytest.raises(RuntimeError, match="past the 1 its caches were sized for"):
        queue.take(0.0, room=1)


# ---- refused at the door -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows, says",
    [
        ([{"messages": [user("only one")]}], "row 1 has 1 user message(s), not a conversation"),
        ([{"messages": "hello"}], "row 1 is not a list of messages"),
        ([{"text": "hello"}], "no 'messages' column"),
    ],
)
def test_a_file_whose_rows_are_not_multi_turn_messages_is_one_line_before_the_model_loads(tmp_path, rows, says):
    path = write_rows(tmp_path, rows)
    proc = run_cli([*SESSIONS, f"workload.path={path}"], cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "workload.path" in lines[0] and says in lines[0] and "at least 2 user messages" in lines[0]
    assert nothing_recorded(tmp_path)


@pytest.mark.parametrize("cache", ["static", "paged", "offloaded"])
def test_a_kept_session_cache_on_a_strategy_that_cannot_continue_one_names_those_that_can(cache):
    with pytest.raises(ConfigError) as refused:
        spec_for(*SESSIONS, f"cache={cache}", "workload.keep_session_cache=true")
    said = str(refused.value)
    assert "workload.keep_session_cache" in said and "expected cache=dynamic or cache=quantized" in said
    assert "\n" not in said


def test_a_kept_session_cache_is_refused_from_the_command_line_with_nothing_written(tmp_path):
    proc = run_cli([*SESSIONS, "cache=static", "workload.keep_session_cache=true"], cwd=tmp_path)
    assert proc.returncode == 2 and "workload.keep_session_cache" in proc.stderr, proc.stderr
    assert nothing_recorded(tmp_path)


@pytest.mark.parametrize("load", [None, "replay"])
def test_sessions_need_a_load_that_starts_them(load):
    overrides = [o for o in SESSIONS if not o.startswith("load=")] + ([f"load={load}"] if load else [])
    with pytest.raises(ConfigError, match="load.kind.*load=offline, load=concurrency, load=rate"):
        spec_for(*overrides)


@pytest.mark.parametrize("setting, value", [("turns", 0), ("sessions", 0), ("think_time_s", -1)])
def test_a_conversations_own_settings_are_checked(setting, value):
    with pytest.raises(ConfigError, match=f"workload.{setting}"):
        spec_for(*SESSIONS, f"workload.{setting}={value}")


def test_keeping_session_caches_is_part_of_what_is_measured():
    kept = spec_for(*SESSIONS, "workload.keep_session_cache=true")
    assert kept.measurement_key() != spec_for(*SESSIONS).measurement_key()
    assert kept.params()["workload.keep_session_cache"] == "true"
