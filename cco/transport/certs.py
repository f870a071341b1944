"""Certificates: a group CA, node certificates, and the identity a certificate proves.

A CCO node is authenticated by an X.509 certificate issued by its group's CA
(draft section "Security Considerations").  The certificate names the node twice,
as subject CN and as a SAN DNSName, both equal to ``node_id``, and its role once,
as subject OU (``endpoint``, ``aggregator`` or ``rendezvous``).  The transport
accepts a peer only if its certificate chains to the group CA, and then trusts
:func:`identity_from_certificate` to say who the peer is; ``Hello`` must repeat
that identity exactly.

The development PKI written by :func:`create_dev_pki` uses one directory::

    ca.pem  ca.key  <node_id>.pem  <node_id>.key ...

Keys are ECDSA P-256: small, fast to generate and to verify in the TLS handshake.
Private keys are written unencrypted with mode 0600; a development CA is not meant
to protect anything of value.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Role

NODE_ID_PATTERN = re.compile(r"[a-z0-9.-]{1,255}")
"""Node ids: lowercase DNS-label-like text, 1 to 255 bytes (ASCII, so bytes == characters)."""

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
DEFAULT_VALID_DAYS = 365
_CLOCK_SKEW = datetime.timedelta(minutes=5)


def is_valid_node_id(node_id: str) -> bool:
    return NODE_ID_PATTERN.fullmatch(node_id) is not None


def role_name(role: Role) -> str:
    """The subject OU that carries ``role``: its registry name in lowercase."""
    return role.name.lower()


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who a certificate says its holder is."""

    node_id: str
    role: Role


@dataclass(frozen=True, slots=True)
class Credentials:
    """A certificate and its private key (a CA's or a node's)."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey


def _validity(valid_days: int) -> tuple[datetime.datetime, datetime.datetime]:
    if valid_days < 1:
        raise ValueError(f"valid_days must be at least 1, got {valid_days}")
    now = datetime.datetime.now(datetime.UTC)
    return now - _CLOCK_SKEW, now + datetime.timedelta(days=valid_days)


def create_ca(common_name: str = "CCO development CA", valid_days: int = DEFAULT_VALID_DAYS) -> Credentials:
    """A self-signed CA that may issue end-entity certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    not_before, not_after = _validity(valid_days)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Credentials(certificate, key)


def issue_node_certificate(
    ca: Credentials, node_id: str, role: Role, valid_days: int = DEFAULT_VALID_DAYS
) -> Credentials:
    """A fresh key pair and a certificate binding it to ``node_id`` and ``role``.

    The certificate is valid for both TLS client and server authentication: every
    node accepts connections (rendezvous, aggregators) or opens them (all roles).
    """
    if not is_valid_node_id(node_id):
        raise ValueError(f"node id {node_id!r} does not match {NODE_ID_PATTERN.pattern}")
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = _validity(valid_days)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role_name(role)),
            x509.NameAttribute(NameOID.COMMON_NAME, node_id),
        ]
    )
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(not_before, ca.certificate.not_valid_before_utc))
        .not_valid_after(min(not_after, ca.certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(node_id)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca.private_key, hashes.SHA256())
    )
    return Credentials(certificate, key)


def identity_from_certificate(certificate: x509.Certificate) -> NodeIdentity:
    """The CCO identity a (chain-verified) certificate proves.

    Exactly one CN and one OU; the CN is a valid node id, the SAN DNSNames are
    exactly that node id, and the OU names a role.  Anything else is refused with
    ``UNAUTHORIZED``: a certificate that can be read two ways identifies no one.
    """
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    units = certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if len(common_names) != 1 or len(units) != 1:
        raise CcoError(ErrorCode.UNAUTHORIZED, "certificate subject needs exactly one CN and one OU")
    node_id, unit = common_names[0].value, units[0].value
    if not isinstance(node_id, str) or not is_valid_node_id(node_id):
        raise CcoError(ErrorCode.UNAUTHORIZED, f"certificate CN {node_id!r} is not a valid node id")
    roles = {role_name(role): role for role in Role}
    if unit not in roles:
        raise CcoError(ErrorCode.UNAUTHORIZED, f"certificate OU {unit!r} is not a CCO role")
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CcoError(ErrorCode.UNAUTHORIZED, "certificate has no subjectAltName") from None
    if san.get_values_for_type(x509.DNSName) != [node_id]:
        raise CcoError(ErrorCode.UNAUTHORIZED, f"certificate SAN DNS names are not exactly [{node_id!r}]")
    return NodeIdentity(node_id=node_id, role=roles[str(unit)])


# --- PEM files ---------------------------------------------------------------------


def write_certificate(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM, readable by its owner only."""
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


def write_credentials(cert_path: Path, key_path: Path, credentials: Credentials) -> None:
    write_private_key(key_path, credentials.private_key)
    write_certificate(cert_path, credentials.certificate)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"{path}: no such file (create one with `cco-node certs`)"
        ) from None
    except OSError as exc:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{path}: cannot read it: {exc.strerror}") from None


def load_certificate(path: Path) -> x509.Certificate:
    """The PEM certificate in ``path``; a missing, unreadable, truncated or malformed
    file is a :class:`CcoError` (``INVALID_FIELD``) naming the file."""
    data = _read(path)
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        pass
    if b"-----BEGIN CERTIFICATE-----" not in data:
        reason = "no PEM certificate in it (no '-----BEGIN CERTIFICATE-----' line)"
    elif b"-----END CERTIFICATE-----" not in data:
        reason = "the PEM certificate is truncated (no '-----END CERTIFICATE-----' line)"
    else:
        reason = "the PEM certificate is malformed"
    raise CcoError(ErrorCode.INVALID_FIELD, f"{path}: {reason}")


def load_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The unencrypted PEM EC private key in ``path``, or a :class:`CcoError` naming the file."""
    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:  # the key is encrypted
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"{path}: the private key is encrypted; nodes need an unencrypted key"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        if b"PRIVATE KEY-----" not in data:
            reason = "no PEM private key in it (no '-----BEGIN PRIVATE KEY-----' line)"
        elif b"-----END" not in data:
            reason = "the PEM private key is truncated (no '-----END ...' line)"
        else:
            reason = "the PEM private key is malformed"
        raise CcoError(ErrorCode.INVALID_FIELD, f"{path}: {reason}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"{path}: expected an EC private key, got {type(key).__name__}"
        )
    return key


def load_credentials(cert_path: Path, key_path: Path) -> Credentials:
    return Credentials(load_certificate(cert_path), load_private_key(key_path))


# --- a development PKI directory ---------------------------------------------------


def node_paths(directory: Path, node_id: str) -> tuple[Path, Path]:
    """Where :func:`create_dev_pki` puts a node's (certificate, key)."""
    if not is_valid_node_id(node_id):
        raise ValueError(f"node id {node_id!r} does not match {NODE_ID_PATTERN.pattern}")
    return directory / f"{node_id}.pem", directory / f"{node_id}.key"


def create_dev_pki(
    directory: Path,
    nodes: Iterable[tuple[str, Role]],
    valid_days: int = DEFAULT_VALID_DAYS,
    *,
    replace: bool = True,
) -> list[Path]:
    """Create (or extend) a development PKI in ``directory``; return the files written.

    The CA is created on first use and reused afterwards, so nodes can be added to
    a running deployment.  Each listed node gets a fresh key and certificate,
    replacing any earlier one of the same id, unless ``replace`` is False: then a
    node whose files exist is refused (``FileExistsError``) before anything is
    written, so that a second run cannot silently change the keys of nodes already
    deployed.  A node id listed twice is refused (``ValueError``): the second
    certificate would silently replace the first.
    """
    nodes = list(nodes)
    ids = [node_id for node_id, _ in nodes]
    repeated = sorted({node_id for node_id in ids if ids.count(node_id) > 1})
    if repeated:
        raise ValueError(f"node id {', '.join(map(repr, repeated))} listed more than once")
    paths = [node_paths(directory, node_id) for node_id in ids]
    if not replace:
        existing = [str(path) for pair in paths for path in pair if path.exists()]
        if existing:
            raise FileExistsError(f"{', '.join(existing)} already exist")
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = directory / CA_CERT_FILE, directory / CA_KEY_FILE
    written: list[Path] = []
    if ca_cert.exists() and ca_key.exists():
        ca = Credentials(load_certificate(ca_cert), load_private_key(ca_key))
    elif ca_cert.exists() or ca_key.exists():
        raise FileExistsError(f"{directory} holds only one of {CA_CERT_FILE} and {CA_KEY_FILE}")
    else:
        ca = create_ca(valid_days=valid_days)
        write_credentials(ca_cert, ca_key, ca)
        written += [ca_cert, ca_key]
    for (node_id, role), (cert_path, key_path) in zip(nodes, paths, strict=True):
        write_credentials(cert_path, key_path, issue_node_certificate(ca, node_id, role, valid_days))
        written += [cert_path, key_path]
    return written


# --- checking a node's own credentials before it starts ------------------------------


def check_node_credentials(
    ca_file: Path, cert_file: Path, key_file: Path, node_id: str, role: Role, now: datetime.datetime
) -> NodeIdentity:
    """Everything a peer would check about this node's credentials, checked before it starts.

    The CA file holds a CA certificate valid at ``now``; the node certificate was
    issued by it, is valid at ``now`` and names ``node_id`` and ``role``; the key is
    the certificate's.  Each failure is a one-line :class:`CcoError`
    (``INVALID_FIELD``) naming the file: found at start, a wrong file is a clear
    error instead of a refused handshake that a node would retry for ever."""
    ca = load_certificate(ca_file)
    certificate = load_certificate(cert_file)
    key = load_private_key(key_file)
    try:
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        is_ca = constraints.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{ca_file}: not a CA certificate (use the group's ca.pem)")
    for path, cert in ((ca_file, ca), (cert_file, certificate)):
        if now < cert.not_valid_before_utc:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"{path}: not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC",
            )
        if now > cert.not_valid_after_utc:
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"{path}: expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
            )
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        issuer = f"'{certificate.issuer.rfc4514_string()}'"
        if certificate.issuer == ca.subject:
            issuer = f"another CA also named {issuer}"
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"{cert_file}: not issued by the CA in {ca_file} but by {issuer}; every node of a "
            "group needs a certificate from the group's CA",
        ) from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != certificate.public_key().public_bytes(*spki):
        raise CcoError(ErrorCode.INVALID_FIELD, f"{key_file}: not the private key of {cert_file}")
    try:
        identity = identity_from_certificate(certificate)
    except CcoError as exc:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{cert_file}: {exc.detail}") from None
    if identity.node_id != node_id:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"{cert_file}: the certificate is for node {identity.node_id!r}, not {node_id!r} (--node-id)",
        )
    if identity.role is not role:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"{cert_file}: the certificate is for the {role_name(identity.role)} role, not the "
            f"{role_name(role)} this node runs as (issue one with `cco-node certs --dir DIR "
            f"{node_id}:{role_name(role)}`)",
        )
    return identity
