"""The state machine against the documented table (docs/architecture.md), pair by pair."""

from __future__ import annotations

import itertools

import pytest

from jobs.exceptions import ControlPlaneError, IllegalTransition
from jobs.states import (
    ACTIVE,
    ALLOWED,
    TERMINAL,
    Status,
    check_transition,
    sources_for,
)

# The documented transitions, written out literally: (from, to).
CONTRACT_TABLE = {
    ("queued", "running"),
    ("queued", "cancelled"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "queued"),
    ("running", "cancelled"),
    ("failed", "queued"),
    ("cancelled", "queued"),
}

STATES = ["queued", "running", "succeeded", "failed", "cancelled"]
ALL_PAIRS = list(itertools.product(STATES, STATES))
REFUSED = [pair for pair in ALL_PAIRS if pair not in CONTRACT_TABLE]


def test_the_five_states_and_their_json_spelling():
    assert [s.value for s in Status] == STATES
    assert TERMINAL == {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}
    assert ACTIVE == {Status.QUEUED, Status.RUNNING}


def test_table_equals_the_contract_exactly():
    assert {(a.value, b.value) for a, b in ALLOWED} == CONTRACT_TABLE
    assert len(ALLOWED) == 8
    assert all(isinstance(a, Status) and isinstance(b, Status) for a, b in ALLOWED)


def test_every_pair_is_classified():
    assert len(ALL_PAIRS) == 25
    assert len(REFUSED) == 17


@pytest.mark.parametrize("source,target", sorted(CONTRACT_TABLE))
def test_allowed_pairs_pass(source, target):
    assert check_transition(source, target) is None
    assert check_transition(Status(source), Status(target)) is None


@pytest.mark.parametrize("source,target", REFUSED)
def test_refused_pairs_raise_a_clear_error(source, target):
    with pytest.raises(IllegalTransition) as info:
        check_transition(source, target)
    error = info.value
    assert isinstance(error, ControlPlaneError)
    assert (error.source, error.target) == (source, target)
    message = str(error)
    assert f"'{source}'" in message and f"'{target}'" in message
    assert "cannot move" in message
    # Also refused when given as enum members.
    with pytest.raises(IllegalTransition):
        check_transition(Status(source), Status(target))


def test_self_transitions_are_refused():
    for state in STATES:
        with pytest.raises(IllegalTransition):
            check_transition(state, state)


def test_terminal_states_only_go_back_to_queued_by_retry():
    assert {(a, b) for a, b in CONTRACT_TABLE if a == "succeeded"} == set()
    for state in ("failed", "cancelled"):
        assert {b for a, b in CONTRACT_TABLE if a == state} == {"queued"}


def test_error_message_names_the_job_when_given():
    error = IllegalTransition(source="succeeded", target="queued", job_id="abc")
    assert str(error).startswith("Job abc cannot move from 'succeeded' to 'queued'")


def test_unknown_state_is_not_silently_accepted():
    with pytest.raises(ValueError):
        check_transition("queued", "paused")
    with pytest.raises(ValueError):
        check_transition("done", "queued")


@pytest.mark.parametrize("target", STATES)
def test_sources_for_matches_the_table(target):
    expected = [s for s in STATES if (s, target) in CONTRACT_TABLE]
    got = sources_for(Status(target))
    assert isinstance(got, tuple)
    assert [s.value for s in got] == expected


def test_sources_for_literal():
    assert sources_for(Status.QUEUED) == (Status.RUNNING, Status.FAILED, Status.CANCELLED)
    assert sources_for(Status.RUNNING) == (Status.QUEUED,)
    assert sources_for(Status.SUCCEEDED) == (Status.RUNNING,)
    assert sources_for(Status.FAILED) == (Status.RUNNING,)
    assert sources_for(Status.CANCELLED) == (Status.QUEUED, Status.RUNNING)
