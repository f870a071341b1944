"""``cco-node status``: ask a live node what it is doing (draft section "Status").

    cco-node status --rendezvous HOST:PORT --pki-dir DIR --node-id ID [--json] [--records N]
    cco-node status --address HOST:PORT --peer-id agg-0 ...   an aggregator, or an endpoint's --status-listen

The tool connects over QUIC with a certificate of its own from the group CA (its role
is read from the certificate; an ``endpoint`` or ``aggregator`` certificate made for
the operator, e.g. ``cco-node certs --dir DIR operator:endpoint``, since a rendezvous
refuses a second connection of a node id that is already connected), sends one
StatusRequest and prints the StatusReply: as text for people, or as JSON
(``--json``) for scripts and ``cco-node trace-analyze``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from cco.services.status import reply_json
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Error, StatusReply, StatusRequest

DEFAULT_RECORDS = 64
"""Flight-recorder entries asked for when --records is not given."""


def status_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = parser_class(
        prog="cco-node status",
        description="Ask a live rendezvous, aggregator or endpoint (at its --status-listen address) "
        "what it is doing: groups, members, epochs, trees, aggregators and their load, and its "
        "latest flight-recorder entries.  Connects with a certificate of the group CA; the role is "
        "read from the certificate.",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--rendezvous",
        metavar="HOST:PORT",
        help="a rendezvous (its certificate names --peer-id, default 'rendezvous')",
    )
    where.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="an aggregator, or an endpoint's --status-listen address (give --peer-id)",
    )
    parser.add_argument("--peer-id", help="node id the answering node's certificate must carry")
    parser.add_argument(
        "--node-id", help="this tool's node id: the CN of its certificate (default: read from --cert)"
    )
    parser.add_argument(
        "--pki-dir", type=Path, help="directory with ca.pem and <node-id>.pem / <node-id>.key"
    )
    parser.add_argument("--ca", type=Path, help="group CA certificate (default <pki-dir>/ca.pem)")
    parser.add_argument("--cert", type=Path, help="this tool's certificate (default <pki-dir>/<node-id>.pem)")
    parser.add_argument("--key", type=Path, help="this tool's key (default <pki-dir>/<node-id>.key)")
    parser.add_argument("--json", action="store_true", help="print the reply as one JSON object")
    parser.add_argument(
        "--records",
        type=int,
        default=DEFAULT_RECORDS,
        help=f"flight-recorder entries to ask for, 0 to 4096 (default {DEFAULT_RECORDS})",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the answer (default 10)"
    )
    return parser


def _ranks_text(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks) if ranks else "-"


def reply_text(reply: StatusReply) -> str:
    """The reply for people: one line per group, member, tree node and aggregator."""
    data = reply_json(reply)
    lines = [
        f"{data['role']} {data['node_id']}: up {reply.uptime_ms / 1000:.0f} s, {len(reply.groups)} groups"
        + (f", {len(reply.aggregators)} aggregators" if reply.aggregators else "")
    ]
    for group in data["groups"]:
        size = f", world size {group['world_size']}" if group["world_size"] is not None else ""
        lines.append(f"group {group['group_id']}: epoch {group['epoch']}, {group['state']}{size}")
        for m in group["members"]:
            away = "" if m["connected"] else " (away)"
            lines.append(f"  rank {m['rank']}: {m['node_id']} {m['state']}{away}")
        for node in group["tree"]:
            parent = f" under {node['parent']}" if node["parent"] else " (root)"
            lines.append(f"  tree: {node['node_id']}{parent}, ranks {_ranks_text(node['ranks'])}")
        if group["excluded"]:
            lines.append(f"  excluded after Reports of tampering: {', '.join(group['excluded'])}")
    for a in data["aggregators"]:
        away = "" if a["connected"] else " (away)"
        lines.append(
            f"aggregator {a['node_id']} at {a['address']}: {a['groups']}/{a['capacity']} groups, "
            f"fan-in {a['max_fan_in']}{away}"
        )
    if data["records"]:
        lines.append(f"flight recorder ({len(data['records'])} latest):")
        for r in data["records"]:
            chunk = "" if r["chunk_index"] is None else f" chunk {r['chunk_index']}"
            missing = f", missing ranks {_ranks_text(r['missing'])}" if r["missing"] else ""
            lines.append(
                f"  group {r['group_id'][:8]} epoch {r['epoch']} op {r['op_id']}{chunk}: {r['kind']} "
                f"{r['elements']} elements, {r['state']}{missing} "
                f"(at {r['started_ms']} ms, last {r['updated_ms']} ms)"
            )
    if reply.omitted:
        lines.append(f"({reply.omitted} entries left out to fit the message size)")
    return "\n".join(lines)


async def ask(
    host: str, port: int, peer_id: str, transport: Any, records: int, timeout: float
) -> StatusReply:
    """Connect, ask once, close; the reply (CcoError for an Error or a lost connection)."""
    from cco.services.node import full_capabilities
    from cco.transport import LocalIdentity, connect
    from cco.transport.certs import identity_from_certificate, load_certificate

    me = identity_from_certificate(load_certificate(transport.cert_file))
    identity = LocalIdentity(me.node_id, me.role, full_capabilities(transport.max_message_size))
    link = await connect(host, port, transport, identity, peer_id, timeout)
    try:
        link.send(StatusRequest(records=records))
        while True:
            message = await asyncio.wait_for(link.receive(), timeout)
            if isinstance(message, StatusReply):
                return message
            if isinstance(message, Error):
                raise CcoError(message.code, f"{peer_id} refused: {message.detail}")
    finally:
        link.close(ErrorCode.NO_ERROR, "status read")
        # Closing is a courtesy to the node: a close still draining after 2 s (its
        # timers stretch on a busy host) must not turn an answer in hand into a failure.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(link.wait_closed(), 2.0)


def status_main(argv: list[str], parser_class: type[argparse.ArgumentParser]) -> int:
    from cco.config import parse_hostport
    from cco.transport import TransportConfig
    from cco.transport.certs import CA_CERT_FILE, node_paths

    args = status_parser(parser_class).parse_args(argv)
    target = args.rendezvous or args.address
    try:
        host, port = parse_hostport(target)
    except ValueError as exc:
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"--{'rendezvous' if args.rendezvous else 'address'}: {exc}"
        ) from None
    peer_id = args.peer_id or ("rendezvous" if args.rendezvous else None)
    if peer_id is None:
        raise CcoError(
            ErrorCode.INVALID_FIELD, "--address needs --peer-id (the node id its certificate carries)"
        )
    if not 0 <= args.records <= 4096:
        raise CcoError(ErrorCode.INVALID_FIELD, f"--records must be 0 to 4096, not {args.records}")
    ca, cert, key = args.ca, args.cert, args.key
    if args.pki_dir is not None:
        if args.node_id is None and cert is None:
            raise CcoError(ErrorCode.INVALID_FIELD, "--pki-dir needs --node-id (whose certificate to use)")
        ca = ca or args.pki_dir / CA_CERT_FILE
        if args.node_id is not None:
            default_cert, default_key = node_paths(args.pki_dir, args.node_id)
            cert, key = cert or default_cert, key or default_key
    if ca is None or cert is None or key is None:
        raise CcoError(
            ErrorCode.INVALID_FIELD, "give --pki-dir and --node-id, or all of --ca, --cert and --key"
        )
    for path in (ca, cert, key):
        if not Path(path).is_file():
            raise CcoError(ErrorCode.INVALID_FIELD, f"{path}: no such file")
    transport = TransportConfig(ca_file=ca, cert_file=cert, key_file=key)
    try:
        reply = asyncio.run(ask(host, port, peer_id, transport, args.records, args.timeout))
    except (TimeoutError, OSError) as exc:
        raise CcoError(ErrorCode.TIMEOUT, f"no answer from {target} ({exc or 'timed out'})") from None
    sys.stdout.write((json.dumps(reply_json(reply)) if args.json else reply_text(reply)) + "\n")
    return 0


__all__ = ["ask", "reply_text", "status_main"]
