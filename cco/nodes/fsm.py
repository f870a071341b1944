"""Transition tables written as data, in the manner of h11.

Each role module declares its states as an ``Enum`` and its legal transitions as a
``TransitionTable``: ``{state: {event name: next state}}``.  The machine asks the
table before acting on an input, so an input that is not legal in the current state
is refused with ``PROTOCOL_VIOLATION`` in one place, and the state diagrams in the
draft are generated from the same tables (:meth:`TransitionTable.to_ascii`), so
the document cannot drift from the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Generic, TypeVar

from cco.wire.errors import CcoError, ErrorCode

S = TypeVar("S", bound=Enum)


class TransitionTable(Generic[S]):
    """The legal (state, event) -> state moves of one machine."""

    def __init__(self, name: str, table: Mapping[S, Mapping[str, S]]) -> None:
        self.name = name
        self.table = {state: dict(moves) for state, moves in table.items()}

    @property
    def states(self) -> list[S]:
        seen: dict[S, None] = {}
        for state, moves in self.table.items():
            seen.setdefault(state)
            for target in moves.values():
                seen.setdefault(target)
        return list(seen)

    @property
    def events(self) -> list[str]:
        seen: dict[str, None] = {}
        for moves in self.table.values():
            for event in moves:
                seen.setdefault(event)
        return list(seen)

    def allows(self, state: S, event: str) -> bool:
        return event in self.table.get(state, {})

    def after(self, state: S, event: str) -> S | None:
        """The state after ``event`` in ``state``, or None for an illegal pair: what
        :meth:`allows` then :meth:`next` give, in one lookup (machines ask it per input)."""
        moves = self.table.get(state)
        return None if moves is None else moves.get(event)

    def next(self, state: S, event: str) -> S:
        """The state after ``event`` in ``state``; refuses an illegal pair."""
        try:
            return self.table[state][event]
        except KeyError:
            raise CcoError(
                ErrorCode.PROTOCOL_VIOLATION,
                f"{self.name}: {event} is not allowed in state {state.name}",
            ) from None

    def to_ascii(self) -> str:
        """One line per transition, states in order of first appearance: the draft's figure."""
        width = max((len(s.name) for s in self.states), default=0)
        lines = [f"{self.name}:"]
        for state in self.states:
            for event, target in self.table.get(state, {}).items():
                lines.append(f"  {state.name:<{width}} --{event}--> {target.name}")
        return "\n".join(lines)
