"""``Struct.from_map`` builds a structure through its slots' setters, not its ``__init__``.

That is only sound if the result is the instance ``__init__`` would have built, so
these tests compare the two for every message type, and check that a class for
which it would not hold is refused instead of being built differently.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import ALL_MESSAGE_CLASSES, message_strategy

from cco.wire.fields import FieldSpec, Struct, UInt, wire
from cco.wire.messages import GroupParams, Message, decode_message, encode_message

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def built_by_init(instance: Struct) -> Struct:
    """The instance ``__init__`` builds from ``instance``'s field values."""
    values = {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}  # type: ignore[arg-type]
    return type(instance)(**values)


def slot_values(instance: Struct) -> dict[str, Any]:
    """Every slot of every class in the MRO (an unset slot raises AttributeError)."""
    names = [name for cls in type(instance).__mro__ for name in cls.__dict__.get("__slots__", ())]
    return {name: getattr(instance, name) for name in names}


@pytest.mark.parametrize("cls", ALL_MESSAGE_CLASSES, ids=lambda c: c.__name__)
def test_a_decoded_message_is_the_one_init_builds(cls: type[Message]) -> None:
    @SETTINGS
    @given(message_strategy(cls))
    def check(message: Message) -> None:
        decoded = decode_message(encode_message(message))
        rebuilt = built_by_init(decoded)
        assert type(decoded) is type(rebuilt) is cls
        assert decoded == rebuilt
        assert hash(decoded) == hash(rebuilt)
        assert slot_values(decoded) == slot_values(rebuilt)
        assert vars(decoded) == vars(rebuilt) == {}  # the unslotted base classes give a __dict__

    check()


def test_an_absent_optional_field_is_none_and_a_defaulted_field_is_what_the_wire_says() -> None:
    params = GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=10, operation_timeout_ms=10)
    raw = params.to_map()
    raw[5] = 512  # block_elements has a Python default, but the wire's value wins
    decoded = GroupParams.from_map(raw)
    assert decoded.float_width is None
    assert decoded.block_elements == 512
    assert decoded == built_by_init(decoded)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _NoSlots(Struct):
    a: int = wire(1, UInt())


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _PostInit(Struct):
    a: int = wire(1, UInt())

    def __post_init__(self) -> None:
        pass


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _ExtraField(Struct):
    a: int = wire(1, UInt())
    b: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _NotInInit(Struct):
    a: int = wire(1, UInt())
    b: int = dataclasses.field(default=0, init=False, metadata={"wire": FieldSpec(2, UInt(), optional=False)})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _OptionalWithDefault(Struct):
    a: int | None = dataclasses.field(default=7, metadata={"wire": FieldSpec(1, UInt(), optional=True)})


@pytest.mark.parametrize(
    ("cls", "problem"),
    [
        (_NoSlots, "slots=True"),
        (_PostInit, "__post_init__"),
        (_ExtraField, "field b is not a wire field"),
        (_NotInInit, "field b is not a wire field"),
        (_OptionalWithDefault, "optional field a does not default to None"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_a_class_init_would_build_differently_is_refused(cls: type[Struct], problem: str) -> None:
    with pytest.raises(TypeError, match=problem):
        cls.from_map({1: 1})
