"""Every CCO message as a frozen dataclass, and the codec between bytes and messages.

A message on the wire is the two-element CBOR array ``[type, body]``: ``type`` is a
code point from :class:`~cco.wire.registries.MessageType` and ``body`` a map with
small unsigned integer keys, declared per class below (draft section "Messages";
the same shapes appear in ``spec/cco.cddl``).  :func:`encode_message` and
:func:`decode_message` are pure functions: no I/O and no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from cco.wire import cbor
from cco.wire.blockscale import block_count
from cco.wire.errors import DecodeError, ErrorCode
from cco.wire.fields import (
    Bitmap,
    Bytes,
    Enum,
    ListOf,
    Nested,
    Struct,
    Text,
    UInt,
    invalid,
    wire,
)
from cco.wire.ops import SUM_KINDS, scaling_problem
from cco.wire.registries import (
    GROUP_ID_SIZE,
    GROUP_SECRET_SIZE,
    MAX_WORLD_SIZE,
    Collective,
    DType,
    MessageType,
    ReduceOp,
    Role,
)

MAC_MODULUS = (1 << 61) - 1
"""p = 2^61 - 1: tags are elements of F_p (draft section "Homomorphic Authentication")."""

MAX_CHUNK_ELEMENTS = 1 << 20
MAX_TOTAL_ELEMENTS = 1 << 40
ELEMENT_WIDTHS = (1, 2, 4, 8)
MIN_BLOCK_ELEMENTS = 16
MAX_BLOCK_ELEMENTS = 1 << 16
MAX_CHUNK_BLOCKS = MAX_CHUNK_ELEMENTS // MIN_BLOCK_ELEMENTS
LOSS_INTERVALS = 3
"""Heartbeat intervals of silence after which a peer is lost, where no liveness window
is given (GroupParams.liveness_ms absent, and every connection of an aggregator)."""
MAX_LIVENESS_MS = 3_600_000
DEFAULT_LIVENESS_MS = 15_000
"""The default liveness window: a member silent for 15 s is lost.  torchelastic's
rendezvous gives up on a worker after 3 missed keep-alives 5 s apart (15 s); torchft's
lighthouse after 5 s.  CCO fails the operations of a group that loses a member, so a
false loss costs more than a slow detection, hence the longer of the two: a training
step, a checkpoint write or a collector pause of some seconds does not cost a rank
its place.  A rank that is really gone is usually named sooner: its closed port
draws ICMP port-unreachable reports, which end the connection at once
(:mod:`cco.transport.unreachable`)."""

_GROUP_ID = Bytes(min_len=GROUP_ID_SIZE, max_len=GROUP_ID_SIZE)
_NODE_ID = Text(min_len=1, max_len=255)
_RANK = UInt(maximum=MAX_WORLD_SIZE - 1)
_WORLD_SIZE = UInt(minimum=1, maximum=MAX_WORLD_SIZE)
_RANK_BITMAP = Bitmap(max_len=MAX_WORLD_SIZE // 8)
MAX_DETAIL = 1024
"""Bytes of UTF-8 in a detail text (Error, JoinReject, Report, Abort); see :func:`clip_detail`."""
_DETAIL = Text(max_len=MAX_DETAIL)
_LABELS = ListOf(Text(min_len=1, max_len=64), max_items=16)
_U32 = UInt(maximum=(1 << 32) - 1)
_U64 = UInt()


# --- shared structures -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities(Struct):
    """What a peer can process; exchanged in Hello and HelloAck."""

    dtypes: tuple[DType, ...] = wire(1, ListOf(Enum(DType), max_items=64))
    ops: tuple[ReduceOp, ...] = wire(2, ListOf(Enum(ReduceOp), max_items=64))
    collectives: tuple[Collective, ...] = wire(3, ListOf(Enum(Collective), max_items=64))
    max_message_size: int = wire(4, UInt(minimum=1024, maximum=(1 << 32) - 1))
    max_chunk_elements: int = wire(5, UInt(minimum=1, maximum=MAX_CHUNK_ELEMENTS))
    extensions: tuple[int, ...] = wire(6, ListOf(_U32, max_items=64))


@dataclass(frozen=True, slots=True, kw_only=True)
class Address(Struct):
    """Where a node accepts QUIC connections."""

    host: str = wire(1, Text(min_len=1, max_len=255))
    port: int = wire(2, UInt(minimum=1, maximum=65535))


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRef(Struct):
    """A node in an aggregation tree, with the ranks whose data reaches it through it."""

    node_id: str = wire(1, _NODE_ID)
    address: Address = wire(2, Nested(Address))
    ranks: bytes = wire(3, _RANK_BITMAP)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupParams(Struct):
    """Per-group parameters every member applies identically."""

    chunk_elements: int = wire(1, UInt(minimum=1, maximum=MAX_CHUNK_ELEMENTS))
    window: int = wire(2, UInt(minimum=1, maximum=4096))
    heartbeat_interval_ms: int = wire(3, UInt(minimum=10, maximum=600_000))
    operation_timeout_ms: int = wire(4, UInt(minimum=10, maximum=86_400_000))
    block_elements: int = wire(5, UInt(minimum=MIN_BLOCK_ELEMENTS, maximum=MAX_BLOCK_ELEMENTS), default=256)
    """Elements per block of block-scaled chunks (each block has its own scale)."""
    float_width: int | None = wire(6, UInt(minimum=1, maximum=8), optional=True)
    """Bytes per block-scaled integer when an operation names none; absent means each
    float dtype's own width (2, 4 or 8)."""
    liveness_ms: int | None = wire(7, UInt(minimum=20, maximum=MAX_LIVENESS_MS), optional=True)
    """Silence after which a member and the rendezvous count each other as lost; absent
    means LOSS_INTERVALS heartbeat intervals.  Longer than the heartbeat interval lets a
    stalled process (a long step, a checkpoint, a paused debugger) keep its place
    without heartbeating more often."""
    scaled_chunk_elements: int | None = wire(8, UInt(minimum=1, maximum=MAX_CHUNK_ELEMENTS), optional=True)
    """The largest chunk_elements the ranks of a block-scaled operation may agree in its
    scale pass, a multiple of block_elements; absent means chunk_elements: such an
    operation's chunks are then never larger than any other's."""

    def validate(self, where: str, encoding: bool) -> None:
        if self.float_width is not None and self.float_width not in ELEMENT_WIDTHS:
            raise invalid(where, f"float_width {self.float_width} is not one of {ELEMENT_WIDTHS}", encoding)
        largest = self.scaled_chunk_elements
        if largest is not None and largest % self.block_elements:
            raise invalid(
                where,
                f"scaled_chunk_elements {largest} is not a multiple of block_elements {self.block_elements}",
                encoding,
            )
        if self.liveness_ms is not None and self.liveness_ms < 2 * self.heartbeat_interval_ms:
            raise invalid(
                where,
                f"liveness_ms {self.liveness_ms} is under two heartbeat intervals "
                f"({self.heartbeat_interval_ms} ms each)",
                encoding,
            )

    @property
    def scaled_chunk_limit(self) -> int:
        """The largest chunk_elements a block-scaled operation's scale pass may agree."""
        if self.scaled_chunk_elements is not None:
            return self.scaled_chunk_elements
        return self.chunk_elements

    @property
    def loss_window(self) -> float:
        """Seconds of silence after which a member or the rendezvous is lost."""
        if self.liveness_ms is not None:
            return self.liveness_ms / 1000
        return LOSS_INTERVALS * self.heartbeat_interval_ms / 1000


# --- messages ----------------------------------------------------------------------


class Message(Struct):
    """Base of every top-level message; ``TYPE`` is its registry code point."""

    TYPE: ClassVar[MessageType]


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Message):
    """First message on a connection, from the connecting side."""

    TYPE: ClassVar[MessageType] = MessageType.HELLO
    versions: tuple[int, ...] = wire(1, ListOf(_U32, min_items=1, max_items=16))
    role: Role = wire(2, Enum(Role))
    node_id: str = wire(3, _NODE_ID)
    capabilities: Capabilities = wire(4, Nested(Capabilities))


@dataclass(frozen=True, slots=True, kw_only=True)
class HelloAck(Message):
    """Answer to Hello: the selected version and the accepting side's capabilities."""

    TYPE: ClassVar[MessageType] = MessageType.HELLO_ACK
    version: int = wire(1, _U32)
    role: Role = wire(2, Enum(Role))
    node_id: str = wire(3, _NODE_ID)
    capabilities: Capabilities = wire(4, Nested(Capabilities))


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Message):
    """A connection-level error report; ``message_type`` names what caused it."""

    TYPE: ClassVar[MessageType] = MessageType.ERROR
    code: ErrorCode = wire(1, Enum(ErrorCode))
    detail: str = wire(2, _DETAIL)
    message_type: int | None = wire(3, UInt(maximum=255), optional=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Message):
    """Liveness probe; the receiver echoes ``seq`` in its own next heartbeat."""

    TYPE: ClassVar[MessageType] = MessageType.HEARTBEAT
    seq: int = wire(1, _U64)


# --- status (draft section "Status") -------------------------------------------------

MAX_STATUS_ITEMS = 4096
"""Groups, aggregators or flight-recorder records in one StatusReply."""
_STATE = Text(min_len=1, max_len=32)
_FLAG = UInt(maximum=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberView(Struct):
    """A member of a group as its rendezvous sees it."""

    rank: int = wire(1, _RANK)
    node_id: str = wire(2, _NODE_ID)
    state: str = wire(3, _STATE)
    connected: int = wire(4, _FLAG)


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeNodeView(Struct):
    """An aggregator of a group's tree: the ranks below it and its parent."""

    node_id: str = wire(1, _NODE_ID)
    ranks: bytes = wire(2, _RANK_BITMAP)
    parent: str | None = wire(3, _NODE_ID, optional=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupView(Struct):
    """A group as the answering node sees it."""

    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    state: str = wire(3, _STATE)
    world_size: int | None = wire(4, _WORLD_SIZE, optional=True)
    members: tuple[MemberView, ...] = wire(5, ListOf(Nested(MemberView), max_items=MAX_WORLD_SIZE))
    tree: tuple[TreeNodeView, ...] = wire(6, ListOf(Nested(TreeNodeView), max_items=MAX_WORLD_SIZE))
    excluded: tuple[str, ...] | None = wire(
        7, ListOf(_NODE_ID, min_items=1, max_items=MAX_STATUS_ITEMS), optional=True
    )
    """Aggregators that members' Reports took out of the group's trees (a rendezvous;
    draft section "Reports of Tampering"), oldest first; absent when there are none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregatorView(Struct):
    """A registered aggregator and its load, as the rendezvous sees it."""

    node_id: str = wire(1, _NODE_ID)
    address: Address = wire(2, Nested(Address))
    capacity: int = wire(3, UInt(minimum=1, maximum=1 << 20))
    max_fan_in: int = wire(4, UInt(minimum=2, maximum=1024))
    groups: int = wire(5, UInt(maximum=1 << 20))
    connected: int = wire(6, _FLAG)
    labels: tuple[str, ...] = wire(7, _LABELS)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordView(Struct):
    """One entry of a node's flight recorder: an operation, or one chunk of it."""

    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    op_id: int = wire(3, _U64)
    chunk_index: int | None = wire(4, _U64, optional=True)
    kind: Collective = wire(5, Enum(Collective))
    state: str = wire(6, _STATE)
    elements: int = wire(7, UInt(maximum=MAX_TOTAL_ELEMENTS))
    missing: bytes = wire(8, _RANK_BITMAP)
    started_ms: int = wire(9, _U64)
    updated_ms: int = wire(10, _U64)


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusRequest(Message):
    """Asks a node what it is doing; ``records`` is how many of its most recent
    flight-recorder entries to include (0: none)."""

    TYPE: ClassVar[MessageType] = MessageType.STATUS_REQUEST
    records: int = wire(1, UInt(maximum=MAX_STATUS_ITEMS))


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusReply(Message):
    """A node's answer to StatusRequest: its groups, the aggregators it knows (a
    rendezvous only) and its latest flight-recorder entries, oldest first."""

    TYPE: ClassVar[MessageType] = MessageType.STATUS_REPLY
    role: Role = wire(1, Enum(Role))
    node_id: str = wire(2, _NODE_ID)
    uptime_ms: int = wire(3, _U64)
    groups: tuple[GroupView, ...] = wire(4, ListOf(Nested(GroupView), max_items=MAX_STATUS_ITEMS))
    aggregators: tuple[AggregatorView, ...] = wire(
        5, ListOf(Nested(AggregatorView), max_items=MAX_STATUS_ITEMS)
    )
    records: tuple[RecordView, ...] = wire(6, ListOf(Nested(RecordView), max_items=MAX_STATUS_ITEMS))
    omitted: int = wire(7, _U64)
    """Entries left out so that the reply fits the asker's max_message_size."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest(Message):
    """An endpoint asks the rendezvous to join a group."""

    TYPE: ClassVar[MessageType] = MessageType.JOIN_REQUEST
    group_id: bytes = wire(1, _GROUP_ID)
    world_size: int = wire(2, _WORLD_SIZE)
    credential: bytes = wire(3, Bytes(max_len=1024))
    rank: int | None = wire(4, _RANK, optional=True)
    labels: tuple[str, ...] = wire(5, _LABELS)

    def validate(self, where: str, encoding: bool) -> None:
        if self.rank is not None and self.rank >= self.world_size:
            raise invalid(where, f"rank {self.rank} is not below world_size {self.world_size}", encoding)


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinAccept(Message):
    """The rendezvous admits an endpoint, giving its rank and the group key material."""

    TYPE: ClassVar[MessageType] = MessageType.JOIN_ACCEPT
    group_id: bytes = wire(1, _GROUP_ID)
    rank: int = wire(2, _RANK)
    world_size: int = wire(3, _WORLD_SIZE)
    epoch: int = wire(4, _U64)
    group_secret: bytes = wire(5, Bytes(min_len=GROUP_SECRET_SIZE, max_len=GROUP_SECRET_SIZE))
    params: GroupParams = wire(6, Nested(GroupParams))

    def validate(self, where: str, encoding: bool) -> None:
        if self.rank >= self.world_size:
            raise invalid(where, f"rank {self.rank} is not below world_size {self.world_size}", encoding)


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinReject(Message):
    """The rendezvous refuses a JoinRequest."""

    TYPE: ClassVar[MessageType] = MessageType.JOIN_REJECT
    group_id: bytes = wire(1, _GROUP_ID)
    code: ErrorCode = wire(2, Enum(ErrorCode))
    detail: str = wire(3, _DETAIL)


@dataclass(frozen=True, slots=True, kw_only=True)
class Leave(Message):
    """A member leaves a group (or the rendezvous removes it)."""

    TYPE: ClassVar[MessageType] = MessageType.LEAVE
    group_id: bytes = wire(1, _GROUP_ID)
    rank: int = wire(2, _RANK)
    code: ErrorCode = wire(3, Enum(ErrorCode))


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregatorRegister(Message):
    """An aggregator offers its capacity to the rendezvous."""

    TYPE: ClassVar[MessageType] = MessageType.AGGREGATOR_REGISTER
    address: Address = wire(1, Nested(Address))
    capacity: int = wire(2, UInt(minimum=1, maximum=1 << 20))
    max_fan_in: int = wire(3, UInt(minimum=2, maximum=1024))
    labels: tuple[str, ...] = wire(4, _LABELS)


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregatorAccept(Message):
    """The rendezvous accepts an aggregator's registration."""

    TYPE: ClassVar[MessageType] = MessageType.AGGREGATOR_ACCEPT
    node_id: str = wire(1, _NODE_ID)
    heartbeat_interval_ms: int = wire(2, UInt(minimum=10, maximum=600_000))


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeAssignment(Message):
    """A node's place in a group's aggregation tree for one epoch.

    For an endpoint, ``parent`` is the aggregator it sends to and ``children`` is
    empty.  For an aggregator, ``children`` are the nodes it accepts data from and
    ``expected`` the ranks whose contributions complete its partial aggregate; a
    root aggregator has no parent and sends results down.
    """

    TYPE: ClassVar[MessageType] = MessageType.TREE_ASSIGNMENT
    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    world_size: int = wire(3, _WORLD_SIZE)
    expected: bytes = wire(4, _RANK_BITMAP)
    children: tuple[NodeRef, ...] = wire(5, ListOf(Nested(NodeRef), max_items=1024))
    params: GroupParams = wire(6, Nested(GroupParams))
    parent: NodeRef | None = wire(7, Nested(NodeRef), optional=True)

    def validate(self, where: str, encoding: bool) -> None:
        bitmaps = {"expected": self.expected}
        bitmaps.update({f"children[{i}].ranks": child.ranks for i, child in enumerate(self.children)})
        if self.parent is not None:
            bitmaps["parent.ranks"] = self.parent.ranks
        for name, bitmap in bitmaps.items():
            if bitmap and highest_rank(bitmap) >= self.world_size:
                raise invalid(
                    where,
                    f"{name} names rank {highest_rank(bitmap)}, not below world_size {self.world_size}",
                    encoding,
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochChange(Message):
    """The group moves to a new epoch; operations of older epochs are abandoned."""

    TYPE: ClassVar[MessageType] = MessageType.EPOCH_CHANGE
    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    members: bytes = wire(3, _RANK_BITMAP)
    code: ErrorCode = wire(4, Enum(ErrorCode))


REPORT_CODES = (ErrorCode.VERIFICATION_FAILED, ErrorCode.OPERATION_MISMATCH)
"""The codes a Report may carry: what an endpoint can find wrong with the data its
parent delivered, a tag or check that fails, or a Result that is not of the
operation it claims to be (draft section "Report")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Report(Message):
    """An endpoint tells the rendezvous that data its parent delivered failed
    verification, so that the group continues in a tree without that path."""

    TYPE: ClassVar[MessageType] = MessageType.REPORT
    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    op_id: int = wire(3, _U64)
    code: ErrorCode = wire(4, Enum(ErrorCode))
    parent: str = wire(5, _NODE_ID)
    detail: str = wire(6, _DETAIL)

    def validate(self, where: str, encoding: bool) -> None:
        if self.code not in REPORT_CODES:
            allowed = ", ".join(code.name for code in REPORT_CODES)
            raise invalid(where, f"code {self.code.name} is not one a Report carries ({allowed})", encoding)


def highest_rank(bitmap: bytes) -> int:
    """The largest rank set in a non-empty deterministic bitmap (its last byte is non-zero)."""
    return (len(bitmap) - 1) * 8 + bitmap[-1].bit_length() - 1


def clip_detail(detail: str) -> str:
    """``detail`` cut to whole characters within what a detail field carries
    (:data:`MAX_DETAIL` bytes of UTF-8), so that a long explanation never makes its
    own Error unsendable."""
    encoded = detail.encode("utf-8")
    if len(encoded) <= MAX_DETAIL:
        return detail
    return encoded[:MAX_DETAIL].decode("utf-8", "ignore")


# chunk_count and chunk_length run several times per chunk message (validation, the
# nodes), so they clamp with comparisons: Python 3.11's min and max parse keyword
# arguments on every call, which made each of these about three times slower.


def chunk_count(total_elements: int, chunk_elements: int) -> int:
    """Chunks of an operation: ceil(total / chunk), and one (empty) chunk for total 0."""
    count = -(-total_elements // chunk_elements)
    return count if count > 1 else 1


def chunk_length(total_elements: int, chunk_elements: int, chunk_index: int) -> int:
    """Elements in chunk ``chunk_index``: ``chunk_elements`` except for the last chunk
    (none past the last)."""
    remaining = total_elements - chunk_index * chunk_elements
    length = chunk_elements if chunk_elements < remaining else remaining
    return length if length > 0 else 0


ROOTED_KINDS = frozenset({Collective.REDUCE, Collective.BROADCAST})
_BARRIER, _INT8 = Collective.BARRIER, DType.INT8
"""Kinds whose chunks name their root rank (a module constant: on Python 3.11 each
enum member looked up on its class is an attribute miss that costs a call)."""


class ChunkShape:
    """What a chunk's shape fields give, for the messages that carry a chunk and the
    headers that name one (:class:`cco.wire.payload.ChunkHeader`)."""

    __slots__ = ()
    total_elements: int
    chunk_elements: int
    chunk_index: int
    block_elements: int | None

    @property
    def element_count(self) -> int:
        """Elements in this chunk."""
        return chunk_length(self.total_elements, self.chunk_elements, self.chunk_index)

    @property
    def block_count(self) -> int:
        """Blocks (and attestation integers) of a block-scaled chunk; 0 otherwise."""
        return 0 if self.block_elements is None else block_count(self.element_count, self.block_elements)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkMessage(Message, ChunkShape):
    """Fields shared by every message that carries one chunk of an operation's data.

    ``payload`` holds ``chunk_length(...)`` integers, little-endian two's complement,
    ``width`` bytes each; a block-scaled chunk (floats under SUM and AVG) also carries
    its blocks' agreed ``scales`` (signed 16-bit, little-endian) and, after its
    elements, one attestation integer per block.  The header fields (everything but
    contributors, payload and tag; width only for block-scaled chunks) identify the
    chunk and are bound into its tag.

    An ALL_REDUCE under the quorum policy (draft section "Stragglers and Quorum")
    adds two kinds of chunk: its presence pass carries ``quorum`` (the fewest
    contributors it may complete with) and ``wait_ms`` (how long aggregators wait
    for more), and the operations the presence pass decides carry ``members``, the
    ranks they run over.
    """

    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    op_id: int = wire(3, _U64)
    kind: Collective = wire(4, Enum(Collective))
    op: ReduceOp = wire(5, Enum(ReduceOp))
    dtype: DType = wire(6, Enum(DType))
    scales: bytes | None = wire(7, Bytes(max_len=2 * MAX_CHUNK_BLOCKS), optional=True)
    total_elements: int = wire(8, UInt(maximum=MAX_TOTAL_ELEMENTS))
    chunk_elements: int = wire(9, UInt(minimum=1, maximum=MAX_CHUNK_ELEMENTS))
    chunk_index: int = wire(10, _U64)
    contributors: bytes = wire(11, _RANK_BITMAP)
    width: int = wire(12, UInt(minimum=1, maximum=8))
    payload: bytes = wire(13, Bytes(max_len=(MAX_CHUNK_ELEMENTS + MAX_CHUNK_BLOCKS) * 8))
    tag: int | None = wire(14, UInt(maximum=MAC_MODULUS - 1), optional=True)
    root: int | None = wire(15, _RANK, optional=True)
    block_elements: int | None = wire(
        16, UInt(minimum=MIN_BLOCK_ELEMENTS, maximum=MAX_BLOCK_ELEMENTS), optional=True
    )
    members: bytes | None = wire(17, _RANK_BITMAP, optional=True)
    quorum: int | None = wire(18, _WORLD_SIZE, optional=True)
    wait_ms: int | None = wire(19, UInt(minimum=1, maximum=86_400_000), optional=True)

    def validate(self, where: str, encoding: bool) -> None:
        """The cross-field checks; a message that passed them on its way out carries a
        mark saying so.

        The payload layer validates each chunk message it builds, and encoding it
        validates it again: a message is immutable and the checks depend on nothing
        else, so the same object passes again, whatever ``where`` and ``encoding``
        (which only word an error).  A copy made with :func:`dataclasses.replace` is a
        new object, checked anew.  A decoded message carries no mark: it is what its
        ``__init__`` would build."""
        if getattr(self, "_valid", False):
            return
        if self.kind in SUM_KINDS and (problem := self._data_moving_problem()) is not None:
            raise invalid(where, problem, encoding)
        if self.width not in ELEMENT_WIDTHS:
            raise invalid(where, f"width {self.width} is not one of {ELEMENT_WIDTHS}", encoding)
        count = chunk_count(self.total_elements, self.chunk_elements)
        if self.chunk_index >= count:
            raise invalid(where, f"chunk_index {self.chunk_index} is not below chunk count {count}", encoding)
        scaled = self.scales is not None
        if scaled != (self.block_elements is not None):
            raise invalid(where, "scales and block_elements must be both present or both absent", encoding)
        problem = scaling_problem(self.kind, self.op, self.dtype, self.total_elements, scaled)
        if problem is not None:
            raise invalid(where, problem, encoding)
        if self.scales is not None and len(self.scales) != 2 * self.block_count:
            raise invalid(
                where,
                f"scales has {len(self.scales)} bytes, {self.block_count} blocks need {2 * self.block_count}",
                encoding,
            )
        expected = (self.element_count + self.block_count) * self.width
        if len(self.payload) != expected:
            raise invalid(where, f"payload has {len(self.payload)} bytes, chunk needs {expected}", encoding)
        if not self.contributors:
            raise invalid(where, "contributors bitmap is empty", encoding)
        needs_root = self.kind in ROOTED_KINDS
        if needs_root != (self.root is not None):
            raise invalid(
                where,
                f"root must be {'present' if needs_root else 'absent'} for {self.kind.name}",
                encoding,
            )
        self._validate_quorum(where, encoding)
        if encoding:
            object.__setattr__(self, "_valid", True)  # in the instance dict: not a wire field

    def _data_moving_problem(self) -> str | None:
        """BROADCAST, ALL_GATHER and BARRIER chunks are sums of patterns: op SUM; a
        BARRIER also has dtype INT8 and no elements."""
        if self.op is not ReduceOp.SUM:
            return f"{self.kind.name} chunks carry op SUM, not {self.op.name}"
        if self.kind is _BARRIER and (self.dtype is not _INT8 or self.total_elements):
            elements = self.total_elements
            return f"a BARRIER chunk has dtype INT8 and 0 elements, not {self.dtype.name} and {elements}"
        return None

    def _validate_quorum(self, where: str, encoding: bool) -> None:
        """members, quorum and wait_ms: ALL_REDUCE only; quorum and wait_ms together, and
        never with members; contributors within members."""
        if self.members is None and self.quorum is None and self.wait_ms is None:
            return
        if self.kind is not Collective.ALL_REDUCE:
            raise invalid(
                where, f"members, quorum and wait_ms are for ALL_REDUCE, not {self.kind.name}", encoding
            )
        if (self.quorum is None) != (self.wait_ms is None):
            raise invalid(where, "quorum and wait_ms come together", encoding)
        if self.quorum is not None and self.members is not None:
            raise invalid(where, "a presence pass (quorum) carries no members", encoding)
        if self.members is not None:
            members = int.from_bytes(self.members, "little")
            if int.from_bytes(self.contributors, "little") & ~members:
                raise invalid(where, "contributors outside members", encoding)


@dataclass(frozen=True, slots=True, kw_only=True)
class Contribution(ChunkMessage):
    """One endpoint's chunk, sent to its parent aggregator."""

    TYPE: ClassVar[MessageType] = MessageType.CONTRIBUTION


@dataclass(frozen=True, slots=True, kw_only=True)
class PartialAggregate(ChunkMessage):
    """The combination of several contributions, travelling up the tree."""

    TYPE: ClassVar[MessageType] = MessageType.PARTIAL_AGGREGATE


@dataclass(frozen=True, slots=True, kw_only=True)
class Result(ChunkMessage):
    """The complete aggregate of a chunk, travelling down the tree to endpoints."""

    TYPE: ClassVar[MessageType] = MessageType.RESULT


@dataclass(frozen=True, slots=True, kw_only=True)
class BroadcastData(ChunkMessage):
    """A chunk of a broadcast: the root's data, forwarded unchanged up then down."""

    TYPE: ClassVar[MessageType] = MessageType.BROADCAST_DATA


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkAck(Message):
    """Confirms delivery of the listed chunks of an operation."""

    TYPE: ClassVar[MessageType] = MessageType.CHUNK_ACK
    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    op_id: int = wire(3, _U64)
    chunks: tuple[int, ...] = wire(4, ListOf(_U64, min_items=1, max_items=4096))


@dataclass(frozen=True, slots=True, kw_only=True)
class RetransmitRequest(Message):
    """Asks for chunks again, naming the contributors still missing if known."""

    TYPE: ClassVar[MessageType] = MessageType.RETRANSMIT_REQUEST
    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    op_id: int = wire(3, _U64)
    chunks: tuple[int, ...] = wire(4, ListOf(_U64, min_items=1, max_items=4096))
    missing: bytes | None = wire(5, _RANK_BITMAP, optional=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Abort(Message):
    """Ends an operation unsuccessfully, naming the ranks that did not contribute."""

    TYPE: ClassVar[MessageType] = MessageType.ABORT
    group_id: bytes = wire(1, _GROUP_ID)
    epoch: int = wire(2, _U64)
    op_id: int = wire(3, _U64)
    code: ErrorCode = wire(4, Enum(ErrorCode))
    detail: str = wire(5, _DETAIL)
    missing: bytes | None = wire(6, _RANK_BITMAP, optional=True)


MESSAGE_CLASSES: dict[MessageType, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        HelloAck,
        Error,
        Heartbeat,
        StatusRequest,
        StatusReply,
        JoinRequest,
        JoinAccept,
        JoinReject,
        Leave,
        AggregatorRegister,
        AggregatorAccept,
        TreeAssignment,
        EpochChange,
        Report,
        Contribution,
        PartialAggregate,
        Result,
        BroadcastData,
        ChunkAck,
        RetransmitRequest,
        Abort,
    )
}
assert set(MESSAGE_CLASSES) == set(MessageType), "every registered type has a class"
_CLASS_BY_CODE: dict[int, type[Message]] = {int(code): cls for code, cls in MESSAGE_CLASSES.items()}


def encode_message(message: Message) -> bytes:
    """The deterministic CBOR encoding of ``[type, body]``: ``to_map`` builds the body
    in the form :func:`cbor.encode_in_order` takes, and the type is a small integer."""
    return cbor.encode_in_order([int(message.TYPE), message.to_map()])


def encode_message_pieces(message: Message, large: int) -> list[bytes]:
    """:func:`encode_message`'s bytes as consecutive pieces: a chunk's payload of at
    least ``large`` bytes is a piece of its own, not copied, as is any other byte
    string of that size in such a chunk (:func:`cbor.encode_in_order_pieces`); any
    other message is one piece, encoded as :func:`encode_message` does (walking a
    small message for large strings cost more than encoding it whole)."""
    if isinstance(message, ChunkMessage) and len(message.payload) >= large:
        return cbor.encode_in_order_pieces([int(message.TYPE), message.to_map()], large)
    return [encode_message(message)]


def decode_message(
    data: bytes | bytearray | memoryview, limits: cbor.DecodeLimits = cbor.DEFAULT_LIMITS
) -> Message:
    """Decode one message; every failure is a :class:`DecodeError` with its code."""
    return _message(cbor.decode(data, limits))


def decode_message_pieces(
    pieces: Sequence[bytes | memoryview], limits: cbor.DecodeLimits = cbor.DEFAULT_LIMITS
) -> Message:
    """:func:`decode_message` of the concatenation of ``pieces`` (a frame as it arrived),
    its payload joined straight out of them (:func:`cbor.decode_pieces`)."""
    return _message(cbor.decode_pieces(pieces, limits))


def _message(raw: cbor.CborValue) -> Message:
    """The message a decoded ``[type, body]`` is; DecodeError if it is none."""
    if not isinstance(raw, list) or len(raw) != 2:
        raise DecodeError(ErrorCode.INVALID_FIELD, "a message is a two-element array [type, body]")
    type_code, body = raw
    if isinstance(type_code, bool) or not isinstance(type_code, int):
        raise DecodeError(ErrorCode.INVALID_FIELD, "message type is not an integer")
    cls = _CLASS_BY_CODE.get(type_code)
    if cls is None:
        raise DecodeError(ErrorCode.UNKNOWN_MESSAGE_TYPE, f"message type {type_code} is not registered")
    return cls.from_map(body)
