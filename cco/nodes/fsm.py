"""Transition tables written as data, in the manner of h2 and h11.

Each role declares its states as an ``Enum``, its inputs as a ``StrEnum`` (the
member's value is the label the draft's figure shows) and what it does on a move as
an ``Enum`` of actions (None for a table whose moves only record where something
stands).  A :class:`TransitionTable` maps ``(state, event)`` to a
:class:`Move`: the next state and the action beside it, as h2's
``(state, input) -> (side effect, next state)``.  The machine asks the table before
it acts on an input, so an input that is not legal in the current state is refused
in one place, with ``PROTOCOL_VIOLATION``, and what it does is what the table says.
The state diagrams in the draft are generated from the same tables
(:meth:`TransitionTable.to_ascii`), so the document cannot drift from the code.

Events are ``StrEnum`` members because a plain ``Enum`` hashes in Python, and the
tables are consulted for every chunk; their labels are free text, never a message
class's name, so renaming a class cannot change a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Generic, TypeVar

from cco.wire.errors import CcoError, ErrorCode


class State(Enum):
    """A state of a transition table.  Its members are singletons, compared by
    identity, so they hash by identity too: a table looks the current state's row up
    for every input, and ``Enum``'s own hash (of the member's name) runs in Python."""

    __hash__ = object.__hash__


S = TypeVar("S", bound=Enum)
E = TypeVar("E", bound=StrEnum)
A = TypeVar("A")


@dataclass(frozen=True, slots=True)
class Move(Generic[S, A]):
    """What one (state, event) pair does: the state after it, and the action beside it."""

    target: S
    action: A


class TransitionTable(Generic[S, E, A]):
    """The legal (state, event) -> (next state, action) moves of one machine."""

    def __init__(self, name: str, table: Mapping[S, Mapping[E, Move[S, A]]]) -> None:
        self.name = name
        self.table = {state: dict(moves) for state, moves in table.items()}

    @property
    def states(self) -> list[S]:
        """Every state, in order of first appearance (sources, then targets)."""
        seen: dict[S, None] = {}
        for state, moves in self.table.items():
            seen.setdefault(state)
            for move in moves.values():
                seen.setdefault(move.target)
        return list(seen)

    @property
    def events(self) -> list[E]:
        """Every event some state allows, in order of first appearance."""
        seen: dict[E, None] = {}
        for moves in self.table.values():
            for event in moves:
                seen.setdefault(event)
        return list(seen)

    def allows(self, state: S, event: E) -> bool:
        return event in self.table.get(state, {})

    def move(self, state: S, event: E) -> Move[S, A] | None:
        """The move ``event`` makes in ``state``; None for an illegal pair (machines ask
        this per input and refuse the input themselves, with their own words)."""
        moves = self.table.get(state)
        return None if moves is None else moves.get(event)

    def fire(self, state: S, event: E) -> Move[S, A]:
        """The move ``event`` makes in ``state``; refuses an illegal pair."""
        move = self.move(state, event)
        if move is None:
            raise CcoError(
                ErrorCode.PROTOCOL_VIOLATION,
                f"{self.name}: {event.value} is not allowed in state {state.name}",
            )
        return move

    def next(self, state: S, event: E) -> S:
        """The state after ``event`` in ``state``; refuses an illegal pair."""
        return self.fire(state, event).target

    def to_ascii(self) -> str:
        """One line per transition, states in order of first appearance: the draft's figure."""
        width = max((len(s.name) for s in self.states), default=0)
        lines = [f"{self.name}:"]
        for state in self.states:
            for event, move in self.table.get(state, {}).items():
                lines.append(f"  {state.name:<{width}} --{event.value}--> {move.target.name}")
        return "\n".join(lines)
