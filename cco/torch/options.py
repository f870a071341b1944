"""Where a torch process finds its CCO settings: ``pg_options``, ``CCO_*`` variables, a file.

A process joining the "cco" backend needs the rendezvous's address, a certificate
and key for its node id, and the CA that signed its peers'.  It takes them, lowest
precedence first, from the defaults, the TOML file ``CCO_CONFIG`` names (``cco-node
standalone`` writes one), ``CCO_*`` environment variables (the names ``cco-node``
reads: ``CCO_RENDEZVOUS``, ``CCO_PKI_DIR``, ``CCO_NODE_ID``, ``CCO_WIDTH`` ...), and
the :class:`Options` passed as ``init_process_group(..., pg_options=...)``.

The node id is ``ep-{rank}`` by default (the global rank; ``{local_rank}`` may be
used too), and ``<id>.g<group>`` for a process group made with ``new_group``, which
needs a session, and so a certificate, of its own.  A missing certificate is issued
on the spot when the PKI directory holds the CA key (a development PKI, such as
``cco-node standalone``'s); otherwise the error names the command that issues it.
With ``stripes`` S above 1 (``CCO_STRIPES``), each process group is S groups
(:class:`~cco.client.striped.StripedCommunicator`), stripe k's session under the node
id ``<id>.s<k>``, its certificate found or issued the same way.

The group id and the join credential are not configured: rank 0 draws both at random
and hands them to the others through the store torch gives the backend (``env://``,
``tcp://`` and ``file://`` alike), so every ``init_process_group`` is a new group that
only its own ranks can join.  ``CCO_GROUP_ID`` and ``CCO_CREDENTIAL`` fix them instead.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cco.client.arrays import NONFINITE_MODES, NonFinite
from cco.client.striped import stripe_node_id
from cco.config import resolve
from cco.transport import TransportConfig, create_dev_pki
from cco.transport.certs import CA_KEY_FILE, is_valid_node_id, node_paths
from cco.transport.config import idle_timeout_above
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Role

WIDTHS = (8, 16, 32, 64)
NONFINITE_CHOICES = (*NONFINITE_MODES, "raise")
DEFAULT_NODE_ID = "ep-{rank}"
MAX_STRIPES = 64
STRIPES_ENV = "CCO_STRIPES"


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """Settings for the "cco" backend given in code: ``pg_options=Options(...)``.  Each
    field left None falls back to its ``CCO_*`` variable, then to ``CCO_CONFIG``'s file."""

    rendezvous: str | None = None
    """``HOST:PORT`` of the rendezvous (``CCO_RENDEZVOUS``)."""
    pki_dir: str | Path | None = None
    """Directory of ``ca.pem`` and ``<node_id>.pem`` / ``.key`` (``CCO_PKI_DIR``)."""
    node_id: str | None = None
    """This rank's node id; ``{rank}`` and ``{local_rank}`` are filled in
    (``CCO_NODE_ID``; default ``ep-{rank}``)."""
    width: int | None = None
    """Bits per element on the wire of float SUM and AVG (8, 16, 32, 64; ``CCO_WIDTH``;
    default: the dtype's own).  The DDP hook (:mod:`cco.torch.hooks`) chooses its own."""
    nonfinite: NonFinite | Literal["raise"] | None = None
    """What float reductions do with inf and NaN (:data:`cco.client.NonFinite`;
    default ``"propagate"``): the result is NaN on every rank when
    any rank's input held inf or NaN, as GradScaler expects of a step that overflowed;
    ``"raise"`` fails the call on the rank that had one (a value it cannot send)."""
    busy_poll_us: int | None = None
    """How long the session polls for datagrams before it sleeps (default 0: the
    training process keeps its cores)."""
    join_timeout: float | None = None
    """Seconds to wait for every rank and a tree (default: the process group's timeout)."""
    liveness_ms: int | None = None
    """The liveness window the job's rendezvous gives its groups (``CCO_LIVENESS_MS``;
    ``cco-node standalone`` writes it to its file; default 15000): how long this process
    may stall, sending nothing, and keep its place.  This rank's connections keep their
    QUIC idle timeout above it; the window itself is the rendezvous's (``--liveness-ms``)."""
    transport: dict[str, Any] | None = None
    """More :class:`~cco.transport.TransportConfig` fields (``max_datagram_size`` ...)."""
    stripes: int | None = None
    """How many groups (stripes) each process group's large calls are cut over
    (``CCO_STRIPES``; default 1): S aggregators' cores for one job when the rendezvous
    places each group on another aggregator (``cco-node --workers``), for S sessions
    and certificates per rank (node ids ``<id>.s1`` ...).  Every rank passes the same.
    See :class:`~cco.client.striped.StripedCommunicator` and the tuning guide."""

    def __post_init__(self) -> None:
        if self.stripes is not None and not (
            isinstance(self.stripes, int)
            and not isinstance(self.stripes, bool)
            and 1 <= self.stripes <= MAX_STRIPES
        ):
            raise ValueError(f"stripes {self.stripes!r} is not an int in [1, {MAX_STRIPES}]")
        if self.width is not None and self.width not in WIDTHS:
            raise ValueError(f"width {self.width} is not one of {WIDTHS}")
        if self.nonfinite is not None and self.nonfinite not in NONFINITE_CHOICES:
            raise ValueError(f"nonfinite {self.nonfinite!r} is not one of {NONFINITE_CHOICES}")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything one process group's session needs, resolved."""

    rendezvous: str
    rendezvous_id: str
    node_id: str
    transport: TransportConfig
    stripes: tuple[TransportConfig, ...]
    """The transports of stripes 1, 2 ... (node ids ``<node_id>.s1`` ...); empty: one stripe."""
    labels: tuple[str, ...]
    width: int | None
    nonfinite: NonFinite | None
    busy_poll_us: int
    join_timeout: float | None
    group_id: bytes | None
    credential: bytes | None


def settings(
    options: Options | None,
    *,
    global_rank: int,
    group_name: str,
    default_group: bool,
    environ: dict[str, str] | None = None,
) -> Settings:
    """Resolve ``options`` over the environment for one process group of this rank."""
    environ = dict(os.environ if environ is None else environ)
    stripes_text = environ.pop(STRIPES_ENV, None)  # the backend's own, not a node option
    options = options if options is not None else Options()
    choice = options.nonfinite or "propagate"
    nonfinite: NonFinite | None = (
        "propagate" if choice == "propagate" else "report" if choice == "report" else None
    )
    node = resolve(argparse.Namespace(role="endpoint", config=None), environ)
    template = options.node_id or node.node_id or DEFAULT_NODE_ID
    node_id = template.format(rank=global_rank, local_rank=environ.get("LOCAL_RANK", global_rank))
    if not default_group:
        node_id = f"{node_id}.g{_group_tag(group_name)}"
    if not is_valid_node_id(node_id):
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"node id {node_id!r}: lowercase letters, digits, '-' and '.'"
        )
    pki_dir = Path(options.pki_dir) if options.pki_dir is not None else node.pki_dir
    liveness_ms = options.liveness_ms if options.liveness_ms is not None else node.liveness_ms
    overrides = {"idle_timeout": idle_timeout_above(liveness_ms), **(options.transport or {})}
    transport = _transport(node.values, pki_dir, node_id, overrides)
    count = options.stripes if options.stripes is not None else _stripes_from(stripes_text)
    if count > 1 and all(node.values.get(key) is not None for key in ("cert", "key", "ca")):
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"{count} stripes need a certificate per stripe ({stripe_node_id(node_id, 1)} ...): "
            "give a PKI directory (CCO_PKI_DIR) instead of one certificate file",
        )
    stripes = tuple(
        _transport(node.values, pki_dir, stripe_node_id(node_id, k), overrides) for k in range(1, count)
    )
    width = options.width if options.width is not None else node.width
    if width is not None and width not in WIDTHS:
        raise CcoError(ErrorCode.INVALID_FIELD, f"CCO_WIDTH {width} is not one of {WIDTHS}")
    group_id = bytes.fromhex(node.group_id) if node.group_id else None
    if group_id is not None and not default_group:
        group_id = hashlib.blake2b(group_id + group_name.encode(), digest_size=len(group_id)).digest()
    return Settings(
        rendezvous=options.rendezvous or node.rendezvous,
        rendezvous_id=node.rendezvous_id,
        node_id=node_id,
        transport=transport,
        stripes=stripes,
        labels=tuple(node.labels),
        width=width,
        nonfinite=nonfinite,
        busy_poll_us=options.busy_poll_us if options.busy_poll_us is not None else 0,
        join_timeout=options.join_timeout,
        group_id=group_id,
        credential=node.credential.encode() if node.credential else None,
    )


def _stripes_from(text: str | None) -> int:
    """``CCO_STRIPES``'s value (None: unset, one stripe)."""
    if text is None:
        return 1
    if not text.isdigit() or not 1 <= int(text) <= MAX_STRIPES:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{STRIPES_ENV} {text!r} is not an int in [1, {MAX_STRIPES}]")
    return int(text)


def _group_tag(group_name: str) -> str:
    """A node-id-safe tag for a torch group name (digits or hex as torch makes them)."""
    tag = group_name.lower()
    return (
        tag
        if re.fullmatch(r"[a-z0-9-]{1,32}", tag)
        else hashlib.blake2b(group_name.encode(), digest_size=6).hexdigest()
    )


_TRANSPORT_KEYS = ("max_datagram_size", "quic_backend", "qlog_dir", "keylog_file")


def _transport(values: Any, pki_dir: Path | None, node_id: str, overrides: dict[str, Any]) -> TransportConfig:
    """The node's transport: explicit ``ca``/``cert``/``key`` files, or ``pki_dir``'s
    (issuing the node's certificate there when the directory holds the CA key)."""
    fields = {key: values[key] for key in _TRANSPORT_KEYS if values.get(key) is not None}
    fields.update(overrides)
    if values.get("cert") is not None and values.get("key") is not None and values.get("ca") is not None:
        return TransportConfig(
            ca_file=values["ca"], cert_file=values["cert"], key_file=values["key"], **fields
        )
    if pki_dir is None:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            "cco needs a PKI directory: set CCO_PKI_DIR (or CCO_CONFIG, as `cco-node standalone` "
            "prints), or pass pg_options=cco.torch.Options(pki_dir=...)",
        )
    cert, _ = node_paths(pki_dir, node_id)
    if not cert.exists():
        if not (pki_dir / CA_KEY_FILE).exists():
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"no certificate for node id {node_id} in {pki_dir}: issue one with "
                f"`cco-node certs --dir DIR {node_id}:endpoint` where the CA key is, and copy it here",
            )
        create_dev_pki(pki_dir, [(node_id, Role.ENDPOINT)])
    return TransportConfig.for_node(pki_dir, node_id, **fields)
