"""What the tests' HTTP servers (threads standing in for an OpenAI-compatible endpoint) share."""

from __future__ import annotations

import json


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
