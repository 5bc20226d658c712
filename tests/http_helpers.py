"""What the tests' HTTP servers (threads standing in for an OpenAI-compatible endpoint) share."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


def send(handler, status, doc=None, headers=None, raw=None):
    """Answer the request `handler` (a BaseHTTPRequestHandler) serves: `status`, `doc` as JSON (or the bytes
    `raw`) and `headers`."""
    data = raw if raw is not None else json.dumps(doc).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(data)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler of the tests' servers: keep-alive, nothing logged, the request body read whole."""

    protocol_version = "HTTP/1.1"  # keep-alive

    def log_message(self, *args):
        pass

    def read_body(self) -> bytes | None:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else None


class FlakyProxy:
    """An HTTP server on 127.0.0.1 (a thread) in front of the server `target` (its root, e.g.
    http://127.0.0.1:8000): it forwards every request there, except every other completion request, which it answers
    503. `url` is its API root (…/v1); `failed` counts the completions it refused, `forwarded` those it passed on."""

    def __init__(self, target: str):
        import threading
        import urllib.request
        from http.server import ThreadingHTTPServer

        proxy = self
        self.failed = self.forwarded = 0
        lock = threading.Lock()

        class Handler(QuietHandler):
            def _handle(self):
                body = self.read_body()
                if self.path.endswith("/completions"):
                    with lock:
                        fail = (proxy.failed + proxy.forwarded) % 2 == 0
                        proxy.failed += fail
                        proxy.forwarded += not fail
                    if fail:
                        return send(self, 503, {"message": "overloaded"})
                req = urllib.request.Request(target + self.path, data=body, method=self.command,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=120) as resp:
                    send(self, resp.status, raw=resp.read())

            do_GET = do_POST = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
