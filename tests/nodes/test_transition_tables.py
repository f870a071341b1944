"""Every transition table of the three roles, as data: each (state, event) pair either
moves to a state of its machine with an action of its kind, or is refused with a
typed protocol error; the tables' figures fit the draft.

The machines' own tests drive each pair through real inputs (test_*_tables.py and the
every-pair tests beside them); this checks the tables themselves, h2 style.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any

import pytest

from cco.nodes import aggregator_states, endpoint_states, rendezvous_states
from cco.nodes.fsm import Move, State, TransitionTable
from cco.wire.errors import CcoError, ErrorCode

TABLES: list[TransitionTable[Any, Any, Any]] = [
    *aggregator_states.TABLES,
    *endpoint_states.TABLES,
    *rendezvous_states.TABLES,
]


def _kinds(table: TransitionTable[Any, Any, Any]) -> tuple[type[Enum], type[StrEnum], type[Enum] | None]:
    """The table's state, event and action classes (None: its moves name no action)."""
    state = type(next(iter(table.table)))
    event = type(table.events[0])
    actions = {type(m.action) for moves in table.table.values() for m in moves.values()}
    assert len(actions) == 1, f"{table.name}: moves name actions of several kinds {actions}"
    (action,) = actions
    return state, event, None if action is type(None) else action


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_every_pair_moves_within_the_machine_or_is_refused(table: TransitionTable[Any, Any, Any]) -> None:
    state_kind, event_kind, action_kind = _kinds(table)
    assert issubclass(state_kind, State) and issubclass(event_kind, StrEnum)
    for state in state_kind:
        for event in event_kind:
            move = table.move(state, event)
            if move is None:
                assert not table.allows(state, event)
                with pytest.raises(CcoError) as refused:
                    table.fire(state, event)
                assert refused.value.code is ErrorCode.PROTOCOL_VIOLATION
                assert table.name in refused.value.detail and event.value in refused.value.detail
                continue
            assert isinstance(move, Move) and table.allows(state, event)
            assert isinstance(move.target, state_kind)
            assert action_kind is None or isinstance(move.action, action_kind)
            assert table.fire(state, event) is move and table.next(state, event) is move.target


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_a_figure_lists_every_move_once_within_an_rfc_line(table: TransitionTable[Any, Any, Any]) -> None:
    lines = table.to_ascii().splitlines()
    assert lines[0] == f"{table.name}:"
    assert max(len(line) for line in lines) <= 69
    shown = []
    for line in lines[1:]:
        source, rest = line.split(" --", 1)
        label, target = rest.rsplit("--> ", 1)
        shown.append((source.strip(), label, target))
    moves = [(s.name, e.value, m.target.name) for s, row in table.table.items() for e, m in row.items()]
    assert sorted(shown) == sorted(moves) and len(shown) == len(set(shown))


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_event_labels_are_unique(table: TransitionTable[Any, Any, Any]) -> None:
    _, event_kind, _ = _kinds(table)
    labels = [e.value for e in event_kind]
    assert len(labels) == len(set(labels))


def test_states_hash_by_identity_as_they_compare() -> None:
    for table in TABLES:
        for state in table.states:
            assert hash(state) == object.__hash__(state)
            assert {state: 1}[state] == 1 and state == state
