"""One running node: a role machine, its QUIC transport, and the runner between them.

The same class serves all three roles; what differs is the machine and whether the
node listens (rendezvous, aggregator) and dials the rendezvous (aggregator,
endpoint).  Connections the machine asks for (``ConnectTo``: an aggregator's parent,
an endpoint's leaf aggregator) are dialled here with the node's own credentials.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cco.nodes.events import Command, ConnectTo
from cco.services.heap import HeapTrimmer
from cco.services.runner import Machine, MachineRunner
from cco.services.status import build_reply
from cco.transport import LocalIdentity, PeerLink, Server, TransportConfig, connect, serve
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import MAX_CHUNK_ELEMENTS, Capabilities, Error, Message, StatusReply, StatusRequest
from cco.wire.registries import Collective, DType, ReduceOp, Role

RENDEZVOUS_PEER = "rendezvous"
"""The PeerId under which a node's connection to the rendezvous is reported."""
REDIAL_FIRST, REDIAL_MAX = 1.0, 30.0
"""Backoff between attempts to reach a lost rendezvous: doubling, capped."""

log = logging.getLogger("cco.node")


def full_capabilities(max_message_size: int) -> Capabilities:
    """This implementation supports every registered dtype, op and collective."""
    return Capabilities(
        dtypes=tuple(DType),
        ops=tuple(ReduceOp),
        collectives=tuple(Collective),
        max_message_size=max_message_size,
        max_chunk_elements=MAX_CHUNK_ELEMENTS,
        extensions=(),
    )


class NodeService:
    """Runs ``machine`` as node ``node_id`` in role ``role``."""

    def __init__(
        self,
        machine: Machine,
        node_id: str,
        role: Role,
        transport: TransportConfig,
        on_command: Callable[[Command], None] = lambda command: None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.identity = LocalIdentity(
            node_id=node_id, role=role, capabilities=full_capabilities(transport.max_message_size)
        )
        self.transport = transport
        self.connect_timeout = connect_timeout
        self.runner = MachineRunner(machine, self._dial, on_command)
        self.runner.status = self.status
        self.server: Server | None = None
        self.heap = HeapTrimmer()  # a serving node gives back what departed peers held
        self.status_server: Server | None = None

    @property
    def machine(self) -> Machine:
        return self.runner.machine

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        """Accept connections; every authenticated link is handed to the machine."""
        self.server = await serve(host, port, self.transport, self.identity, self._accepted)
        self.server.on_connection_ended = self.heap.released
        self.runner.on_epoch_change = self.heap.released  # and what a group's last epoch held
        return self.server.address

    def _accepted(self, link: PeerLink) -> None:
        self.runner.attach(link)

    def status(self, request: StatusRequest, limit: int, now: float) -> StatusReply:
        """This node's answer to ``request``, within ``limit`` bytes and its own message size."""
        return build_reply(
            request,
            role=self.identity.role,
            node_id=self.identity.node_id,
            machine=self.runner.machine,
            recorder=self.runner.recorder,
            now=now,
            max_size=min(limit, self.transport.max_message_size),
        )

    async def listen_status(self, host: str, port: int) -> tuple[str, int]:
        """Answer StatusRequest on an address of its own (an endpoint, which accepts no
        other connections): any other message there closes the connection."""
        self.status_server = await serve(host, port, self.transport, self.identity, self._status_link)
        return self.status_server.address

    def _status_link(self, link: PeerLink) -> None:
        link.listen(_StatusOnly(self, link))

    async def join_rendezvous(
        self, host: str, port: int, rendezvous_id: str, peer: str = RENDEZVOUS_PEER
    ) -> None:
        """Dial the rendezvous; the machine sees it as ``peer`` (a fresh name for each
        connection of a node that registers again, so that a late report about the
        old connection cannot be taken for the new one)."""
        link = await connect(host, port, self.transport, self.identity, rendezvous_id, self.connect_timeout)
        self.runner.attach(link, peer)

    def _dial(self, command: ConnectTo) -> asyncio.Task[PeerLink]:
        return asyncio.ensure_future(
            connect(
                command.address.host,
                command.address.port,
                self.transport,
                self.identity,
                command.expected_node_id,
                self.connect_timeout,
            )
        )

    async def close(self) -> None:
        self.heap.cancel()
        await self.runner.close()
        if self.runner.metrics is not None:
            self.runner.metrics.close()
        for server in (self.server, self.status_server):
            if server is not None:
                await server.close()


class _StatusOnly:
    """A connection to a status address: StatusRequests answered, anything else refused."""

    def __init__(self, service: NodeService, link: PeerLink) -> None:
        self._service = service
        self._link = link

    def deliver(self, item: Message | CcoError) -> None:
        link = self._link
        if isinstance(item, StatusRequest):
            now = self._service.runner.clock()
            link.send(self._service.status(item, link.capabilities.max_message_size, now))
            link.flush()
        elif not isinstance(item, Error):
            link.close(ErrorCode.PROTOCOL_VIOLATION, "this address answers StatusRequest only")

    def closed(self, code: ErrorCode, detail: str) -> None:
        """Nothing to undo: the connection held no state."""


class Redialer:
    """Dials a lost rendezvous again for a node whose machine is detached from it:
    each :meth:`attempt` after a failed one waits 1 s, 2 s, 4 s ... up to 30 s first.
    Each connection gets a fresh PeerId, so that a late report about an old one cannot
    be taken for it."""

    def __init__(
        self,
        service: NodeService,
        rendezvous: tuple[str, int],
        rendezvous_id: str,
        who: str,
        first_refusal_is_final: bool = False,
    ) -> None:
        self.first_refusal_is_final = first_refusal_is_final
        self.service = service
        self.rendezvous = rendezvous
        self.rendezvous_id = rendezvous_id
        self.who = who
        self.attempts = 0
        self.connected = False  # ever connected: from then on every failure is retried
        self._delay = REDIAL_FIRST

    async def attempt(self, pause: Callable[[float], Awaitable[None]]) -> bool:
        """Dial once; on failure, log it and ``pause`` for the backoff.  True if connected.

        With ``first_refusal_is_final``, raises CcoError(UNAUTHORIZED) when the very
        first connection is refused for authorization (a certificate of another CA, on
        either side): asking again would be refused the same way, so the node should
        stop and say so.  Once it has been connected, every failure is retried (a
        restarting rendezvous)."""
        self.attempts += 1
        host, port = self.rendezvous
        try:
            await self.service.join_rendezvous(
                host, port, self.rendezvous_id, peer=f"rendezvous#{self.attempts}"
            )
        except CcoError as exc:
            if exc.code is ErrorCode.UNAUTHORIZED and self.first_refusal_is_final and not self.connected:
                raise CcoError(
                    ErrorCode.UNAUTHORIZED,
                    f"{self.who}: rendezvous {host}:{port} and this node do not trust each other "
                    f"({exc.detail}); are both certificates from the same group CA?",
                ) from None
            await self._failed(exc, pause)
            return False
        except (OSError, TimeoutError) as exc:
            await self._failed(exc, pause)
            return False
        self.connected = True
        self._delay = REDIAL_FIRST
        return True

    async def _failed(self, exc: Exception, pause: Callable[[float], Awaitable[None]]) -> None:
        host, port = self.rendezvous
        log.warning(
            "%s: rendezvous %s:%d unreachable (%s); again in %g s", self.who, host, port, exc, self._delay
        )
        await pause(self._delay)
        self._delay = min(2 * self._delay, REDIAL_MAX)
