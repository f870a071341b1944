"""Who the peer is: the certificate check both QUIC backends run after TLS.

A CCO peer must present a certificate chaining to the group CA, naming a valid
node identity, and (for a client) the node it meant to reach.  aioquic's TLS
client verifies the server's chain itself (``verify_mode`` CERT_REQUIRED), while
its server never verifies a client's, so the server does that here.

Failures are aioquic TLS alerts, so that the refusal reaches the peer as
CRYPTO_ERROR plus the alert (RFC 9001, section 4.8) whichever backend closes.
"""

from __future__ import annotations

from aioquic import tls
from cryptography import x509

from cco.transport.certs import NodeIdentity, identity_from_certificate
from cco.wire.errors import CcoError


class CertificateRequired(tls.Alert):
    description = tls.AlertDescription.certificate_required


def verified_identity(
    certificate: x509.Certificate | None,
    chain: list[x509.Certificate],
    *,
    is_client: bool,
    cafile: str | None,
    expected_node_id: str | None,
) -> NodeIdentity:
    """The identity ``certificate`` proves, or an aioquic ``tls.Alert`` saying why not.

    ``cafile`` is the group CA; a server checks the client's chain against it
    (a client's TLS already checked the server's).  ``expected_node_id`` is the
    node a client means to reach (None on a server).
    """
    if certificate is None:
        raise CertificateRequired("a CCO peer must present a certificate")
    if not is_client:
        tls.verify_certificate(certificate=certificate, chain=chain, cafile=cafile)
    try:
        identity = identity_from_certificate(certificate)
    except CcoError as exc:
        raise tls.AlertBadCertificate(exc.detail) from exc
    if expected_node_id is not None and identity.node_id != expected_node_id:
        raise tls.AlertBadCertificate(
            f"server certificate is for {identity.node_id!r}, expected {expected_node_id!r}"
        )
    return identity
