"""An OpenAI-compatible endpoint as the openai backend reaches it: what of `--base-url` may be recorded or
printed, which credential a request carries, and HTTP exchanges bounded in time and in size.

- `redact_url` is the one way a URL is written anywhere (run.json, scores.json, results.json, messages): its
  user info and every query value are masked, since either may hold a secret (`http://user:pw@host`,
  `?api_key=...`, a signed `?sig=...`) and a query parameter's name does not say whether its value is one.
- The credential: `OPENAI_API_KEY` (or the variable the backend is given) as `Authorization: Bearer`, or the
  user name and password of `--base-url` as HTTP basic auth (RFC 7617), never both: a request carries one
  `Authorization` header, so a URL with user info while the key is set is refused rather than one of them
  dropped silently. The credential is named, never shown (`Endpoint.credential`).
- `BoundedTransport`: an httpx transport whose every network read, write and connect ends at the deadline
  of the exchange in progress on its thread (`deadline()`), so a server that trickles its answer a byte at
  a time cannot hold a request past its timeout; httpx's own timeouts bound each read only
  (https://www.python-httpx.org/advanced/timeouts/). Proxy variables are not used: the endpoint is reached
  directly, through this transport.
"""

from __future__ import annotations

import base64
import contextlib
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator

import httpcore
import httpx

from longctx.core.errors import SettingError, ref
from longctx.core.secrets import REDACTED, redact_url

# A secret shorter than this is not masked in free text (a server's error message): a one- or two-character
# value would mask every occurrence of those characters.
_MIN_SECRET = 3


class Endpoint:
    """`--base-url` split into what is sent and what is shown.

    `shown`: the redacted URL (messages, settings); `server`: the redacted URL without user info (what a run
    directory is bound to: a changed password or key is the same server); `credential`: which credential the
    requests carry, in words; `url(path)`: the URL a request goes to (no user info: the credential goes in a
    header). SettingError for a URL that is not http(s), and for user info while `api_key_env` is set, naming
    the setting as `owner` (the backend's options) does.
    """

    def __init__(self, base_url: str, api_key_env: str = "OPENAI_API_KEY", owner: type | None = None):
        self.api_key_env = api_key_env
        try:
            parts = urllib.parse.urlsplit(base_url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingError(f"{ref('base_url')} '{redact_url(base_url)}' is not an http(s) URL; "
                               "e.g. http://127.0.0.1:8000/v1", owner)
        user, at, host = parts.netloc.rpartition("@")
        name, _, password = user.partition(":")
        self._basic = (urllib.parse.unquote(name), urllib.parse.unquote(password)) if at else None
        values = [v for _, _, v in (p.partition("=") for p in parts.query.split("&"))]
        self._secrets = {*values, *map(urllib.parse.unquote_plus, values), name, password, *(self._basic or ())}
        path = parts.path.rstrip("/")
        self._base = urllib.parse.urlunsplit((parts.scheme, host, path, "", ""))
        self._query = f"?{parts.query}" if parts.query else ""
        try:
            httpx.URL(self.url(""))
        except httpx.InvalidURL:
            raise SettingError(f"{ref('base_url')} '{redact_url(base_url)}' is not an http(s) URL; "
                               "e.g. http://127.0.0.1:8000/v1", owner) from None
        # the fragment is never sent: it is left out of what is shown
        self.shown = redact_url(urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")))
        self.server = redact_url(self.shown, userinfo=False)
        if self._basic is not None and os.environ.get(api_key_env):
            raise SettingError(f"{ref('base_url')} '{self.shown}' holds a user name and password (basic auth) and "
                               f"{api_key_env} is set (a Bearer key): a request carries one of them; drop the user "
                               f"info from {ref('base_url')} or unset {api_key_env}", owner)
        # a line that is said (`credential: ...`), not an error: it names the option as the command line does
        self.credential = (f"basic auth from the user info of {owner.flag('base_url') if owner else 'base_url'}"
                           if self._basic is not None else
                           f"{api_key_env} (Bearer)" if os.environ.get(api_key_env) else "none")

    def __repr__(self) -> str:
        return f"Endpoint({self.shown!r})"

    def url(self, path: str) -> str:
        """The URL of `path` (e.g. "/models") under the base URL, with its query: what a request is sent to."""
        return self._base + path + self._query

    def headers(self) -> dict[str, str]:
        """The `Authorization` header of the credential (the key read from the environment now), if any."""
        if self._basic is not None:
            pair = ":".join(self._basic).encode("utf-8")
            return {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
        key = os.environ.get(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def scrub(self, text: str) -> str:
        """`text` (a server's words, an exception's) with every secret of this endpoint in it masked: a server
        may echo the URL it was asked for, or the key."""
        # the Authorization header's value too: a server may echo the header
        secrets = {*self._secrets, *(v.partition(" ")[2] for v in self.headers().values())}
        for secret in sorted((s for s in secrets if len(s) >= _MIN_SECRET), key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend, each connect, read and write cut short at the deadline of the exchange the
    calling thread is in (none: httpx's timeouts alone)."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self._local = threading.local()

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        self._local.end = time.monotonic() + seconds
        try:
            yield
        finally:
            self._local.end = None

    def cap(self, timeout: float | None, late: type[Exception]) -> float | None:
        """`timeout`, or less when the deadline comes first; `late` when it has passed."""
        end = getattr(self._local, "end", None)
        if end is None:
            return timeout
        left = end - time.monotonic()
        if left <= 0:
            raise late("the request's deadline passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self._inner.connect_tcp(host, port, self.cap(timeout, httpcore.ConnectTimeout), local_address,
                                         socket_options)
        return _DeadlineStream(stream, self)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):  # pragma: no cover - http(s) only
        return _DeadlineStream(self._inner.connect_unix_socket(path, self.cap(timeout, httpcore.ConnectTimeout),
                                                               socket_options), self)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, backend: _DeadlineBackend):
        self._inner, self._backend = inner, backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._backend.cap(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._backend.cap(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        inner = self._inner.start_tls(ssl_context, server_hostname, self._backend.cap(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner, self._backend)

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


@contextlib.contextmanager
def _as_httpx() -> Iterator[None]:
    """httpcore's exceptions as httpx's classes of the same name (what httpx's own transport does)."""
    try:
        yield
    except Exception as e:
        mapped = getattr(httpx, type(e).__name__, None) if type(e).__module__.startswith("httpcore") else None
        if not (isinstance(mapped, type) and issubclass(mapped, httpx.TransportError)):
            raise
        raise mapped(str(e)) from e


class _ResponseStream(httpx.SyncByteStream):
    def __init__(self, stream) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx():
            yield from self._stream

    def close(self) -> None:
        with _as_httpx():
            self._stream.close()


class BoundedTransport(httpx.BaseTransport):
    """Direct connections (at most `connections`, all kept alive) whose network waits end at `deadline()`."""

    def __init__(self, connections: int):
        self.network = _DeadlineBackend()
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), max_connections=connections,
                                             max_keepalive_connections=connections, network_backend=self.network)

    def deadline(self, seconds: float):
        """A context in which this thread's exchanges end `seconds` from now (httpx.ReadTimeout, ...)."""
        return self.network.deadline(seconds)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        req = httpcore.Request(method=request.method, url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host,
                                                                       port=url.port, target=url.raw_path),
                               headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        with _as_httpx():
            resp = self._pool.handle_request(req)
        return httpx.Response(resp.status, headers=resp.headers, stream=_ResponseStream(resp.stream),
                              extensions=resp.extensions)

    def close(self) -> None:
        self._pool.close()


def read_body(resp: httpx.Response, max_bytes: int) -> bytes | None:
    """The body of the streamed `resp`, or None when it is longer than `max_bytes` (its Content-Length says so,
    or reading passed it: nothing more is read)."""
    declared = resp.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        return None
    body = bytearray()
    for chunk in resp.iter_bytes():
        body += chunk
        if len(body) > max_bytes:
            return None
    return bytes(body)
