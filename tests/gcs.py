"""A real GCS server on loopback for tests, reachable by Beam, google-cloud-storage and TensorFlow.

- The `gcp-storage-emulator` package serves the GCS JSON and download APIs over HTTP on
  127.0.0.1. Beam and google-cloud-storage go there through STORAGE_EMULATOR_HOST.
- TensorFlow's built-in GCS client has its endpoints compiled in
  (https://www.googleapis.com/storage/v1/, https://storage.googleapis.com/<bucket>/...).
  Its libcurl honours HTTPS_PROXY, so a small CONNECT proxy on 127.0.0.1 takes those
  connections, terminates TLS with a certificate for both names (signed by a CA made
  here, trusted through CURL_CA_BUNDLE), and relays the plain HTTP to the emulator.
  No root, no /etc/hosts, no port 443. GOOGLE_AUTH_TOKEN_FOR_TESTING skips OAuth.
- IAM is not emulated: every request naming the bucket FORBIDDEN_BUCKET gets GCS's 403,
  and so does every read of an object in LIST_ONLY_BUCKET (listing it works), as for an
  account holding storage.objects.list without storage.objects.get.
- Beam connects anonymously at once, without its credential lookup's backoff (15-25 s).
- `GcsEmulator.recording()` lists the responses the server sends (method, path, body
  bytes): what an operation costs in requests and bytes, whichever client made them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
import select
import socket
import ssl
import threading
import urllib.parse

GCS_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
# TensorFlow's GCS filesystem reads these when TensorFlow is imported: conftest sets them.
TF_GCS_ENV = {
    # 64 MB read blocks by default; 1 MB blocks make a test's server failure land mid-file.
    "GCS_READ_CACHE_BLOCK_SIZE_MB": "1",
    # Bounded retries: the default (10, backing off to 32 s) takes minutes to give up.
    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "500000",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tls_files(directory: str) -> tuple:
    """(ca.pem, leaf.pem, leaf.key) for GCS_HOSTS, signed by a fresh test CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ingest test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GCS_HOSTS[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in GCS_HOSTS]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = tuple(os.path.join(directory, n) for n in ("ca.pem", "leaf.pem", "leaf.key"))
    with open(paths[0], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths[1], "wb") as f:
        f.write(leaf.public_bytes(serialization.Encoding.PEM))
    with open(paths[2], "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return paths


class TlsRelayProxy:
    """An HTTPS CONNECT proxy that terminates TLS for GCS_HOSTS and relays to a plain HTTP server."""

    def __init__(self, upstream: tuple, cert: str, key: str):
        self._upstream = upstream
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(cert, key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = self._listener.getsockname()
        self._stopped = threading.Event()
        self.down = False  # refuse and drop connections: the server "goes away"
        self._open = set()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        self._listener.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client):
        with contextlib.closing(client):
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = client.recv(4096)
                if not chunk:
                    return
                request += chunk
            target = request.split(b" ", 2)[1].decode()
            if not request.startswith(b"CONNECT ") or target.rsplit(":", 1)[0] not in GCS_HOSTS:
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            if self.down:
                return
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            try:
                tls = self._context.wrap_socket(client, server_side=True)
                first = tls.recv(65536)
                upstream = socket.create_connection(self._upstream)
                upstream.sendall(first)
            except (ssl.SSLError, OSError):
                return
            self._open.update((tls, upstream))
            with contextlib.closing(tls), contextlib.closing(upstream):
                _pump(tls, upstream, lambda: self.down)
            self._open.difference_update((tls, upstream))

    def go_down(self):
        """Drops open connections and refuses new ones, as a crashed server would."""
        self.down = True
        for s in list(self._open):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self):
        self._stopped.set()
        self._listener.close()
        self._thread.join(timeout=2)


def _pump(a, b, stop=lambda: False):
    """Copies bytes both ways until either side closes (or `stop()`)."""
    sockets = [a, b]
    while not stop():
        # TLS sockets may hold decrypted bytes that select() cannot see.
        ready = [s for s in sockets if isinstance(s, ssl.SSLSocket) and s.pending()]
        if not ready:
            ready, _, _ = select.select(sockets, [], [], 0.5)
            if not ready:
                continue
        for s in ready:
            try:
                data = s.recv(65536)
            except (ssl.SSLError, OSError):
                return
            if not data:
                return
            (b if s is a else a).sendall(data)


def _https_urls_for_gcs_hosts():
    """The emulator builds upload and media URLs as http://<Host header>; real GCS (and the
    TLS relay in front of the emulator) answers https://. The first seam patched here."""
    from urllib.parse import urlparse

    from gcp_storage_emulator import server

    if getattr(server.Request, "_ingest_https", False):
        return
    original = server.Request.__init__

    def init(self, request_handler, method):
        original(self, request_handler, method)
        if request_handler.headers.get("Host", "").split(":")[0] in GCS_HOSTS:
            self._base_url = "https://" + request_handler.headers["Host"]
            self._full_url = self._base_url + self._path
            self._parsed_url = urlparse(self._full_url)

    server.Request.__init__ = init
    server.Request._ingest_https = True


FORBIDDEN_BUCKET = "forbidden"
LIST_ONLY_BUCKET = "listonly"
# JSON API paths (/storage/v1/b/<bucket>..., also under /download and /upload) and XML ones (/<bucket>/...)
_NAMES_FORBIDDEN = re.compile(
    rf"^(/download|/upload)?(/storage/v1)?/b/{FORBIDDEN_BUCKET}(/|\?|$)|^/{FORBIDDEN_BUCKET}/"
)
# An object's metadata or content: /storage/v1/b/<bucket>/o/<name>, /download/..., /<bucket>/<name>
_READS_LIST_ONLY = re.compile(rf"^(/download)?/storage/v1/b/{LIST_ONLY_BUCKET}/o/[^?]|^/{LIST_ONLY_BUCKET}/.")


def _denied(method: str, path: str) -> str | None:
    """The permission GCS would find missing for this request, or None."""
    listing = method == "GET" and path.split("?")[0].endswith("/o")
    if _NAMES_FORBIDDEN.search(path):
        return "objects.list" if listing else "objects.get" if method == "GET" else "objects.create"
    if method == "GET" and _READS_LIST_ONLY.search(path):
        return "objects.get"
    return None


def _forbidden_bucket_answers_403():
    """IAM is not emulated: a request `_denied` gets the 403 GCS gives an account
    without the permission, whoever sends it (Beam and google-cloud-storage directly,
    TensorFlow through the TLS relay). The second seam patched here."""
    from http import HTTPStatus

    from gcp_storage_emulator import server

    if getattr(server.Router, "_ingest_forbidden", False):
        return
    original = server.Router.handle

    def handle(self, method):
        what = _denied(method, self._request_handler.path)
        if what is None:
            return original(self, method)
        message = (
            f"ingest-test@example.com does not have storage.{what} access to the Google Cloud Storage "
            f"{'bucket' if what == 'objects.list' else 'object'}. "
            f"Permission 'storage.{what}' denied on resource (or it may not exist)."
        )
        response = server.Response(self._request_handler)
        response.status = HTTPStatus.FORBIDDEN
        response.json({"error": {"code": 403, "message": message, "errors": [{"reason": "forbidden"}]}})
        response.close()

    server.Router.handle = handle
    server.Router._ingest_forbidden = True


@dataclasses.dataclass(frozen=True)
class Served:
    """One response of the emulator: the request's method and path, and the body's bytes."""

    method: str
    path: str
    bytes: int

    @property
    def object(self) -> str | None:
        """The object the request names (its metadata or its content), or None (a listing, a bucket)."""
        path = self.path.split("?")[0]
        json_api = re.match(r"^(?:/download|/upload)?(?:/storage/v1)?/b/[^/]+/o/(.+)$", path)
        if json_api:
            return urllib.parse.unquote(json_api.group(1))
        xml_api = re.match(r"^/[^/]+/(.+)$", path)
        return urllib.parse.unquote(xml_api.group(1)) if xml_api and not path.startswith(("/b/", "/storage/")) else None

    @property
    def content(self) -> bool:
        """Whether the body is an object's bytes (a download), not JSON about it."""
        path, _, query = self.path.partition("?")
        xml_api = not path.startswith(("/b/", "/storage/", "/download/", "/upload/"))
        return self.method == "GET" and (xml_api or path.startswith("/download/") or "alt=media" in query)


_RECORDERS: list = []


def _responses_are_recorded():
    """Every response the emulator sends is appended to the recordings open at the time
    (`GcsEmulator.recording`): what a client's operation costs in requests and bytes,
    counted where GCS would bill them. The third seam patched here."""
    from gcp_storage_emulator import server

    if getattr(server.Response, "_ingest_recorded", False):
        return
    original = server.Response.close

    def close(self):
        content = self._content.encode("utf-8") if isinstance(self._content, str) else self._content
        for recording in list(_RECORDERS):
            recording.append(Served(self._handler.command, self._handler.path, len(content)))
        return original(self)

    server.Response.close = close
    server.Response._ingest_recorded = True


def _beam_connects_anonymously():
    """Beam looks for Google credentials once per process and, finding none, retries with
    backoff before it connects anonymously: 15-25 s of each test worker's first GCS job
    (2 + 4 + 8 + 16 s, jittered). The emulator takes anonymous requests, so the lookup is
    settled as Beam would settle it, at once. The fourth seam patched here (Beam's own
    cache of the outcome: `get_service_credentials` returns what it holds)."""
    from apache_beam.internal.gcp import auth

    with auth._Credentials._credentials_lock:
        if not auth._Credentials._credentials_init:
            auth._Credentials._credentials, auth._Credentials._credentials_init = None, True


class GcsEmulator:
    """gcp-storage-emulator on 127.0.0.1, plus the TLS relay TensorFlow needs."""

    def __init__(self, directory: str):
        from gcp_storage_emulator.server import create_server

        _https_urls_for_gcs_hosts()
        _beam_connects_anonymously()
        _forbidden_bucket_answers_403()
        _responses_are_recorded()

        self.port = free_port()
        self._server = create_server("127.0.0.1", self.port, in_memory=True)
        self._server.start()
        self.ca, cert, key = make_tls_files(directory)
        self._proxy = TlsRelayProxy(("127.0.0.1", self.port), cert, key)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        """Environment for Beam, google-cloud-storage and TensorFlow to use this server."""
        return {
            "STORAGE_EMULATOR_HOST": self.host,
            "HTTPS_PROXY": "http://%s:%d" % self._proxy.address,
            "https_proxy": "http://%s:%d" % self._proxy.address,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "CURL_CA_BUNDLE": self.ca,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
            "GOOGLE_CLOUD_PROJECT": "test-project",
        }

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test-project", credentials=AnonymousCredentials(), client_options={"api_endpoint": self.host}
        )

    @property
    def proxy(self) -> TlsRelayProxy:
        return self._proxy

    @contextlib.contextmanager
    def recording(self):
        """A list of every response (`Served`) the server sends inside the `with`."""
        served: list = []
        _RECORDERS.append(served)
        try:
            yield served
        finally:
            _RECORDERS.remove(served)

    def wipe(self):
        self._server.wipe()

    def stop(self):
        self._proxy.stop()
        self._server.stop()
