"""The transport's pure parts: certificates, Hello/HelloAck rules, config, credit, close mapping."""

from __future__ import annotations

import datetime
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from aioquic.quic.connection import Limit
from aioquic.quic.events import ConnectionTerminated
from aioquic.quic.packet import QuicErrorCode, QuicFrameType
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cco.transport.certs import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    Credentials,
    NodeIdentity,
    create_ca,
    create_dev_pki,
    identity_from_certificate,
    is_valid_node_id,
    issue_node_certificate,
    load_certificate,
    node_paths,
)
from cco.transport.config import TransportConfig
from cco.transport.connection import ReceiveCredit
from cco.transport.handshake import LocalIdentity, accept_hello_ack, build_hello, negotiate
from cco.transport.link import describe_termination
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Capabilities
from cco.wire.registries import Collective, DType, ReduceOp, Role

pytestmark = pytest.mark.quic_backends("aioquic")  # backend-independent parts: run once
"""Pure functions and objects, no QUIC connection: nothing depends on the backend."""

CAPS = Capabilities(
    dtypes=(DType.INT32, DType.INT64),
    ops=(ReduceOp.SUM,),
    collectives=(Collective.ALL_REDUCE,),
    max_message_size=1 << 24,
    max_chunk_elements=1 << 16,
    extensions=(),
)


@pytest.fixture(scope="module")
def ca() -> Credentials:
    return create_ca()


# --- certificates ------------------------------------------------------------------


@pytest.mark.parametrize("node_id", ["a", "7", "10.0.0.1", "agg-1.rack2", "x" * 255])
def test_valid_node_ids(node_id: str) -> None:
    assert is_valid_node_id(node_id)


@pytest.mark.parametrize("node_id", ["", "Ep1", "ep_1", "ep 1", "é", "x" * 256])
def test_invalid_node_ids_are_refused_when_issuing(ca: Credentials, node_id: str) -> None:
    assert not is_valid_node_id(node_id)
    with pytest.raises(ValueError):
        issue_node_certificate(ca, node_id, Role.ENDPOINT)


@pytest.mark.parametrize("role", list(Role))
def test_issued_certificate_carries_identity(ca: Credentials, role: Role) -> None:
    node = issue_node_certificate(ca, "node-7", role)
    assert identity_from_certificate(node.certificate) == NodeIdentity("node-7", role)
    assert node.certificate.issuer == ca.certificate.subject
    constraints = node.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is False


def _certificate(
    ca: Credentials, subject: list[tuple[x509.ObjectIdentifier, str]], san: list[str] | None
) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(oid, value) for oid, value in subject]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if san is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in san]), critical=False
        )
    return builder.sign(ca.private_key, hashes.SHA256())


CN, OU = NameOID.COMMON_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME


@pytest.mark.parametrize(
    ("subject", "san", "complaint"),
    [
        ([(CN, "ep-1")], ["ep-1"], "exactly one CN and one OU"),
        ([(OU, "endpoint")], ["ep-1"], "exactly one CN and one OU"),
        ([(OU, "endpoint"), (OU, "aggregator"), (CN, "ep-1")], ["ep-1"], "exactly one CN and one OU"),
        ([(OU, "endpoint"), (CN, "EP-1")], ["EP-1"], "not a valid node id"),
        ([(OU, "switch"), (CN, "ep-1")], ["ep-1"], "not a CCO role"),
        ([(OU, "endpoint"), (CN, "ep-1")], None, "no subjectAltName"),
        ([(OU, "endpoint"), (CN, "ep-1")], ["ep-2"], "SAN DNS names"),
        ([(OU, "endpoint"), (CN, "ep-1")], ["ep-1", "ep-2"], "SAN DNS names"),
    ],
)
def test_certificates_without_a_clear_identity_are_refused(
    ca: Credentials, subject: list[tuple[x509.ObjectIdentifier, str]], san: list[str] | None, complaint: str
) -> None:
    certificate = _certificate(ca, subject, san)
    with pytest.raises(CcoError) as info:
        identity_from_certificate(certificate)
    assert info.value.code is ErrorCode.UNAUTHORIZED
    assert complaint in info.value.detail


def test_dev_pki_directory(tmp_path: Path) -> None:
    written = create_dev_pki(tmp_path, [("rendezvous", Role.RENDEZVOUS), ("ep-0", Role.ENDPOINT)])
    names = sorted(p.name for p in written)
    assert names == sorted(
        [CA_CERT_FILE, CA_KEY_FILE, "rendezvous.pem", "rendezvous.key", "ep-0.pem", "ep-0.key"]
    )
    for path in written:
        if path.suffix == ".key":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cert_path, _ = node_paths(tmp_path, "ep-0")
    assert identity_from_certificate(load_certificate(cert_path)) == NodeIdentity("ep-0", Role.ENDPOINT)

    # A second call reuses the CA and only adds the new node.
    ca_before = (tmp_path / CA_CERT_FILE).read_bytes()
    added = create_dev_pki(tmp_path, [("agg-1", Role.AGGREGATOR)])
    assert sorted(p.name for p in added) == ["agg-1.key", "agg-1.pem"]
    assert (tmp_path / CA_CERT_FILE).read_bytes() == ca_before
    agg = load_certificate(tmp_path / "agg-1.pem")
    assert agg.issuer == load_certificate(tmp_path / CA_CERT_FILE).subject


def test_dev_pki_refuses_half_a_ca(tmp_path: Path) -> None:
    (tmp_path / CA_CERT_FILE).write_text("")
    with pytest.raises(FileExistsError):
        create_dev_pki(tmp_path, [])


# --- Hello / HelloAck --------------------------------------------------------------

SERVER = LocalIdentity("agg-1", Role.AGGREGATOR, replace(CAPS, extensions=(7, 8)))
CLIENT = LocalIdentity("ep-1", Role.ENDPOINT, replace(CAPS, extensions=(9, 7, 1000)))
CLIENT_CERT = NodeIdentity("ep-1", Role.ENDPOINT)
SERVER_CERT = NodeIdentity("agg-1", Role.AGGREGATOR)


def test_negotiation_picks_highest_common_version_and_echoes_known_extensions() -> None:
    hello = build_hello(CLIENT, versions=(1, 3, 2))
    assert hello.versions == (3, 2, 1)
    ack, session = negotiate(hello, SERVER, CLIENT_CERT, supported_versions=(1, 2))
    assert ack.version == 2 and session.version == 2
    assert ack.capabilities.extensions == (7,)  # 9 and 1000 unknown to the server: ignored
    assert (ack.node_id, ack.role) == ("agg-1", Role.AGGREGATOR)
    assert (session.node_id, session.role, session.extensions) == ("ep-1", Role.ENDPOINT, frozenset({7}))
    client_view = accept_hello_ack(ack, hello, SERVER_CERT)
    assert (client_view.version, client_view.node_id, client_view.extensions) == (2, "agg-1", frozenset({7}))


def test_negotiation_without_common_version() -> None:
    with pytest.raises(CcoError) as info:
        negotiate(build_hello(CLIENT, versions=(5, 6)), SERVER, CLIENT_CERT, supported_versions=(1,))
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION


@pytest.mark.parametrize(
    "certified", [NodeIdentity("ep-2", Role.ENDPOINT), NodeIdentity("ep-1", Role.AGGREGATOR)]
)
def test_hello_must_match_the_certificate(certified: NodeIdentity) -> None:
    with pytest.raises(CcoError) as info:
        negotiate(build_hello(CLIENT, versions=(99,)), SERVER, certified)
    # Identity is judged first: a liar learns nothing about supported versions.
    assert info.value.code is ErrorCode.UNAUTHORIZED


def test_hello_ack_checks() -> None:
    hello = build_hello(CLIENT)
    ack, _ = negotiate(hello, SERVER, CLIENT_CERT)
    with pytest.raises(CcoError) as info:
        accept_hello_ack(ack, hello, NodeIdentity("agg-2", Role.AGGREGATOR))
    assert info.value.code is ErrorCode.UNAUTHORIZED
    with pytest.raises(CcoError) as info:
        accept_hello_ack(replace(ack, version=99), hello, SERVER_CERT)
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    bad_echo = replace(ack, capabilities=replace(ack.capabilities, extensions=(8,)))
    with pytest.raises(CcoError) as info:
        accept_hello_ack(bad_echo, hello, SERVER_CERT)
    assert info.value.code is ErrorCode.PROTOCOL_VIOLATION


# --- configuration -----------------------------------------------------------------


def test_config_for_node_paths_and_validation(tmp_path: Path) -> None:
    config = TransportConfig.for_node(tmp_path, "ep-1", max_datagram_size=9000)
    assert (config.ca_file, config.cert_file, config.key_file) == (
        tmp_path / "ca.pem",
        tmp_path / "ep-1.pem",
        tmp_path / "ep-1.key",
    )
    assert config.max_datagram_size == 9000
    for bad in (
        {"max_datagram_size": 1199},
        {"max_datagram_size": 65508},
        {"max_message_size": 100},
        {"idle_timeout": 0},
        {"receive_buffer": 1000},
        {"versions": ()},
    ):
        with pytest.raises(ValueError):
            TransportConfig.for_node(tmp_path, "ep-1", **bad)


def test_quic_backend_is_one_we_have(tmp_path: Path) -> None:
    assert TransportConfig.for_node(tmp_path, "ep-1", quic_backend="qh3").quic_backend == "qh3"
    with pytest.raises(ValueError, match="quic_backend 'quiche' is not one of aioquic, qh3"):
        TransportConfig.for_node(tmp_path, "ep-1", quic_backend="quiche")


def test_quic_backend_defaults_to_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CCO_QUIC_BACKEND", raising=False)
    assert TransportConfig.for_node(tmp_path, "ep-1").quic_backend == "qh3"
    monkeypatch.setenv("CCO_QUIC_BACKEND", "aioquic")
    assert TransportConfig.for_node(tmp_path, "ep-1").quic_backend == "aioquic"
    assert TransportConfig.for_node(tmp_path, "ep-1", quic_backend="qh3").quic_backend == "qh3"
    monkeypatch.setenv("CCO_QUIC_BACKEND", "tcp")
    with pytest.raises(ValueError, match="quic_backend 'tcp'"):
        TransportConfig.for_node(tmp_path, "ep-1")


# --- receive credit ----------------------------------------------------------------


def _credit(window: int) -> ReceiveCredit:
    return ReceiveCredit(Limit(frame_type=QuicFrameType.MAX_DATA, name="max_data", value=1), window)


def test_receive_credit_slides_with_receipt_in_quarter_steps() -> None:
    credit = _credit(1000)
    assert credit.value == credit.sent == 1000
    credit.used = 600
    credit.value = 2000  # aioquic asks to double once half is used
    assert credit.value == 1600  # granted: received + window, not double
    credit.used = 1700
    credit.value = 3200
    assert credit.value == 2700
    credit.used = 1800
    credit.value = 5400
    assert credit.value == 2700  # 2800 - 2700 < window / 4: not worth a MAX_DATA frame


def test_frozen_credit_does_not_grow_and_never_shrinks() -> None:
    credit = _credit(1000)
    credit.frozen = True
    credit.used = 1000
    credit.value = 2000
    assert credit.value == 1000
    credit.frozen = False
    credit.value = 2000
    assert credit.value == 2000
    credit.value = 10
    assert credit.value == 2000


# --- how a close is reported -------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (ConnectionTerminated(int(ErrorCode.ABORTED), None, "bye"), ErrorCode.ABORTED),
        (ConnectionTerminated(0x7777, None, ""), ErrorCode.PROTOCOL_VIOLATION),
        (
            ConnectionTerminated(QuicErrorCode.CRYPTO_ERROR + 42, QuicFrameType.CRYPTO, "x"),
            ErrorCode.UNAUTHORIZED,
        ),
        (ConnectionTerminated(QuicErrorCode.CRYPTO_ERROR + 120, 6, ""), ErrorCode.UNSUPPORTED_VERSION),
        (ConnectionTerminated(QuicErrorCode.INTERNAL_ERROR, 0, "Idle timeout"), ErrorCode.PEER_LOST),
        (ConnectionTerminated(QuicErrorCode.FLOW_CONTROL_ERROR, 8, "over"), ErrorCode.PROTOCOL_VIOLATION),
        (ConnectionTerminated(QuicErrorCode.NO_ERROR, 0, ""), ErrorCode.NO_ERROR),
    ],
)
def test_describe_termination(event: ConnectionTerminated, code: ErrorCode) -> None:
    assert describe_termination(event)[0] is code
