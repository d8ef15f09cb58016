"""A local HTTPS server with a certificate signed by a throwaway CA: what a pod sees of
Kubeflow Trainer's status endpoint (its CA file, a bearer token, JSON POSTs)."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class StatusServer:
    url: str
    ca_file: Path
    received: list[dict[str, Any]] = field(default_factory=list)  # {"headers", "body", "path"}


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _certificate(subject: str, key, issuer: str, issuer_key, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def make_certificates(folder: Path, issuer: str = "test-ca") -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) files in ``folder``."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(issuer, ca_key, issuer, ca_key, ca=True)
    server = _certificate("localhost", key, issuer, ca_key, ca=False)
    encoding = serialization.Encoding.PEM
    key_bytes = key.private_bytes(
        encoding, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return (
        _pem(folder / f"{issuer}.crt", ca.public_bytes(encoding)),
        _pem(folder / "server.crt", server.public_bytes(encoding)),
        _pem(folder / "server.key", key_bytes),
    )


@contextlib.contextmanager
def status_server(folder: Path) -> Iterator[StatusServer]:
    """An HTTPS server on 127.0.0.1 recording every POST; its CA file is ``ca_file``."""
    ca_file, cert, key = make_certificates(folder)
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"headers": dict(self.headers), "body": body, "path": self.path})
            reply = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/wine/status"
    try:
        yield StatusServer(f"https://localhost:{server.server_address[1]}{path}", ca_file, received)
    finally:
        server.shutdown()
        server.server_close()
