"""The `openai` backend against a real HTTP server on 127.0.0.1 (a thread in this process): the served-model and
context checks, retries, Retry-After, connection reuse, timeouts, failures mid-run and the API key."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import ThreadingHTTPServer

import pytest
from http_helpers import QuietHandler, send

from longctx.core.errors import InputError
from longctx.eval.backends.openai import MAX_RETRY_AFTER_S, OpenAIBackend, retry_after
from longctx.eval.request import Request

CKPT = "runs/tiny-yarn"
CKPT_DIR = "/data/checkpoints/tiny-yarn"


class FakeServer:
    """An OpenAI-compatible server: `GET /v1/models` lists `cards`; `POST /v1/completions` answers `reply` with
    the prompt's length in characters as `prompt_tokens`, unless `completion(i)` (i: the completion request's
    number, from 0) returns (status, headers, body) to send instead (it may sleep first). With `key` set, a
    request without `Authorization: Bearer <key>` gets 401. Every request is recorded in `seen`."""

    def __init__(self, cards=None, reply="the answer", completion=None, key=None):
        self.cards = [{"id": "tiny", "root": CKPT_DIR, "max_model_len": 8192}] if cards is None else cards
        self.reply, self.completion, self.key = reply, completion, key
        self.seen: list[dict] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(QuietHandler):
            disable_nagle_algorithm = True  # the headers and the body, each sent at once

            _send = send

            def _handle(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                with fake.lock:
                    i = sum(s["path"] == "/v1/completions" for s in fake.seen)
                    fake.seen.append({"path": self.path, "body": body, "time": time.monotonic(),
                                      "client": self.client_address, "auth": self.headers.get("Authorization")})
                try:
                    if fake.key is not None and self.headers.get("Authorization") != f"Bearer {fake.key}":
                        return self._send(401, {"error": {"message": "invalid API key"}})
                    if self.path == "/v1/models" and self.command == "GET":
                        return self._send(200, {"object": "list", "data": fake.cards})
                    if self.path != "/v1/completions":
                        return self._send(404, {"detail": "Not Found"})
                    planned = fake.completion(i) if fake.completion else None
                    if planned is not None:
                        status, headers, doc = planned
                        return self._send(status, doc, headers)
                    self._send(200, {"choices": [{"index": 0, "text": f"{fake.reply} {body['prompt']}"}],
                                     "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 2}})
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    self.close_connection = True

            do_GET = do_POST = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True  # a handler still sleeping does not hold up the test's end
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def completions(self) -> list[dict]:
        with self.lock:
            return [s for s in self.seen if s["path"] == "/v1/completions"]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve(monkeypatch):
    """serve(**FakeServer options) -> a running FakeServer, stopped at the end of the test."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # the server is on 127.0.0.1, never behind a proxy
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    servers: list[FakeServer] = []
    backends: list[OpenAIBackend] = []

    def start(**kwargs) -> FakeServer:
        servers.append(FakeServer(**kwargs))
        return servers[-1]

    start.backends = backends
    yield start
    for b in backends:
        b.close()
    for s in servers:
        s.stop()


def backend(serve, server, model=None, **kwargs) -> OpenAIBackend:
    options = {"checkpoint": CKPT, "checkpoint_dir": CKPT_DIR, "max_model_len": 4097, "retry_wait": 0.01, **kwargs}
    b = OpenAIBackend(server.url, model, **options)
    serve.backends.append(b)
    return b


def requests(n: int) -> list[Request]:
    return [Request(i, f"prompt-{i}", 16) for i in range(n)]


def collect(b: OpenAIBackend, reqs: list[Request]) -> list[tuple]:
    got = []
    b.generate(reqs, lambda r, text, tokens: got.append((r.key, text, tokens)))
    return got


def test_generates_greedy_and_records_the_server(serve):
    server = serve()
    b = backend(serve, server, seed=7)
    assert b.ran is None
    got = collect(b, requests(3))
    assert sorted(got) == [(i, f"the answer prompt-{i}", len(f"prompt-{i}")) for i in range(3)]
    body = server.completions()[0]["body"]
    assert body == {"model": "tiny", "prompt": body["prompt"], "max_tokens": 16, "temperature": 0.0, "top_p": 1.0,
                    "seed": 7}
    card = {"id": "tiny", "root": CKPT_DIR, "max_model_len": 8192}
    assert b.ran == {"server": card}
    assert b.settings() == {"name": "openai", "base_url": server.url, "model": "tiny", "concurrency": 8,
                            "timeout": 600.0, "retries": 3, "trust_served_model": False, "server": card}
    assert b.binding() == {"base_url": server.url, "served_model": "tiny", "served_root": CKPT_DIR}
    b.check()  # idempotent: no second probe
    assert sum(s["path"] == "/v1/models" for s in server.seen) == 1


def test_a_server_with_a_smaller_context_is_refused_before_any_completion(serve):
    server = serve(cards=[{"id": "tiny", "root": CKPT_DIR, "max_model_len": 2048}])
    b = backend(serve, server)
    with pytest.raises(InputError) as e:
        collect(b, requests(2))
    assert str(e.value) == (
        f"endpoint {server.url} serves 'tiny' with max_model_len 2048, but this run needs 4097 tokens (its longest "
        "length with the generation budget and special tokens); restart the server with --max-model-len 4097 or "
        "more, or use shorter --lengths")
    assert server.completions() == [] and b.ran is None


def test_a_server_without_max_model_len_is_accepted_unchecked(serve):
    server = serve(cards=[{"id": "tiny", "root": CKPT_DIR}])
    b = backend(serve, server)
    b.check()
    assert b.ran == {"server": {"id": "tiny", "root": CKPT_DIR, "max_model_len": None}}


def test_another_served_model_is_refused_unless_trusted(serve):
    server = serve(cards=[{"id": "other", "root": "/models/other", "max_model_len": 8192}])
    with pytest.raises(InputError) as e:
        backend(serve, server).check()
    msg = str(e.value)
    assert "\n" not in msg and "'other'" in msg and "/models/other" in msg and repr(CKPT) in msg and CKPT_DIR in msg
    assert "start the server with this checkpoint" in msg and "--trust-served-model" in msg
    b = backend(serve, server, trust_served_model=True)
    assert collect(b, requests(1))[0][1] == "the answer prompt-0"
    assert b.settings()["trust_served_model"] is True and b.settings()["model"] == "other"
    assert b.settings()["server"] == {"id": "other", "root": "/models/other", "max_model_len": 8192}
    assert b.binding() == {"base_url": server.url, "served_model": "other", "served_root": "/models/other",
                           "trust_served_model": True}


def test_a_named_served_model_must_be_listed(serve):
    server = serve(cards=[{"id": "tiny", "root": CKPT_DIR, "max_model_len": 8192},
                          {"id": "lora-a", "root": "/adapters/a"}])
    with pytest.raises(InputError) as e:
        backend(serve, server, model="big").check()
    assert str(e.value) == (f"endpoint {server.url} does not serve 'big': it serves 'tiny', 'lora-a'; "
                            "pass --served-model with one of them")
    one = serve(cards=[{"id": "tiny", "root": CKPT_DIR}])
    with pytest.raises(InputError, match="it serves 'tiny'; pass --served-model tiny$"):
        backend(serve, one, model="big").check()
    empty = serve(cards=[])
    with pytest.raises(InputError, match="serves no model"):
        backend(serve, empty).check()
    b = backend(serve, server, model="lora-a", trust_served_model=True)  # the second card, by name
    b.check()
    assert b.model == "lora-a" and b.binding()["served_root"] == "/adapters/a"


def test_the_served_model_is_matched_by_root_id_or_realpath(serve, tmp_path):
    # chosen automatically (the first listed), matched by root == the resolved folder
    server = serve(cards=[{"id": "tiny", "root": CKPT_DIR, "max_model_len": 8192},
                          {"id": "other", "root": "/models/other"}])
    b = backend(serve, server)
    b.check()
    assert b.model == "tiny"
    # matched by id == the Hub id the user gave (root: the server's own snapshot folder)
    hub = serve(cards=[{"id": "org/tiny-yarn", "root": "/srv/hf/snapshots/abc", "max_model_len": 8192}])
    b = backend(serve, hub, checkpoint="org/tiny-yarn", checkpoint_dir="/home/u/.cache/hf/snapshots/abc")
    b.check()
    assert b.model == "org/tiny-yarn"
    # matched by realpath: the server loaded the same folder through a link
    real = tmp_path / "ckpt"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    linked = serve(cards=[{"id": "served", "root": str(tmp_path / "link"), "max_model_len": 8192}])
    b = backend(serve, linked, checkpoint="ckpt", checkpoint_dir=str(real))
    b.check()
    assert b.model == "served"
    # an existing folder that is not the checkpoint is not a match
    (tmp_path / "else").mkdir()
    elsewhere = serve(cards=[{"id": "served", "root": str(tmp_path / "else"), "max_model_len": 8192}])
    with pytest.raises(InputError, match="--trust-served-model"):
        backend(serve, elsewhere, checkpoint="ckpt", checkpoint_dir=str(real)).check()


def test_retry_after_is_honoured(serve):
    server = serve(completion=lambda i: (429, {"Retry-After": "1"}, {"error": {"message": "busy"}}) if i == 0 else None)
    b = backend(serve, server, concurrency=1)  # retry_wait 0.01: only Retry-After makes it wait a second
    got = collect(b, requests(1))
    assert got == [(0, "the answer prompt-0", 8)]
    first, second = server.completions()
    assert second["time"] - first["time"] >= 0.9


def test_retry_after_values():
    now = datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert retry_after("7", now) == 7.0 and retry_after(" 0 ", now) == 0.0
    assert retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0.0  # already passed
    assert retry_after("86400", now) == MAX_RETRY_AFTER_S
    assert retry_after(None, now) is None and retry_after("soon", now) is None and retry_after("-5", now) is None
    # digits that are not ASCII digits ("²", "٣"), and more digits than a float holds: not delay-seconds, or the cap
    assert retry_after("²", now) is None and retry_after("٣", now) is None
    assert retry_after("9" * 5000, now) == MAX_RETRY_AFTER_S


def test_5xx_is_retried_then_fails_in_one_line(serve):
    server = serve(completion=lambda i: (503, {}, {"message": "loading"}) if i < 2 else None)
    got = collect(backend(serve, server, concurrency=1), requests(1))
    assert got == [(0, "the answer prompt-0", 8)] and len(server.completions()) == 3
    down = serve(completion=lambda i: (503, {}, {"message": "model\nis loading"}))
    with pytest.raises(InputError) as e:
        collect(backend(serve, down, concurrency=1, retries=2), requests(1))
    assert str(e.value) == (f"endpoint {down.url} failed 3 times (HTTP 503: model is loading); the predictions "
                            "made so far are kept: rerun the same command to continue")
    assert len(down.completions()) == 3


def test_connections_are_reused(serve):
    server = serve()
    got = collect(backend(serve, server, concurrency=2), requests(30))
    assert len(got) == 30 and len(server.completions()) == 30
    assert len({s["client"] for s in server.seen}) <= 2


def test_the_timeout_is_configurable(serve):
    def slow(i):
        time.sleep(3)
        return None

    server = serve(completion=slow)
    b = backend(serve, server, timeout=0.5, retries=0)
    t0 = time.monotonic()
    with pytest.raises(InputError) as e:
        collect(b, requests(1))
    assert time.monotonic() - t0 < 2.5
    assert str(e.value) == (f"endpoint {server.url} failed 1 time (ReadTimeout: no response within 0.5 s); the "
                            "predictions made so far are kept: rerun the same command to continue")


def test_predictions_before_a_failure_are_reported_first(serve):
    server = serve(completion=lambda i: (400, {}, {"error": {"message": "prompt too\nlong"}}) if i >= 5 else None)
    got = []
    with pytest.raises(InputError) as e:
        backend(serve, server, concurrency=1).generate(requests(20), lambda r, t, n: got.append(r.key))
    assert got == [0, 1, 2, 3, 4]
    assert str(e.value) == f"endpoint {server.url} rejected a completion request (HTTP 400: prompt too long)"
    assert len(server.completions()) == 6  # nothing sent after the failure


def test_requests_in_flight_finish_after_a_failure(serve):
    def plan(i):
        if i == 0:
            return 400, {}, {"error": {"message": "bad request"}}
        time.sleep(0.3)  # still running when request 0 fails
        return None

    server = serve(completion=plan)
    got = []
    with pytest.raises(InputError, match="HTTP 400: bad request"):
        backend(serve, server, concurrency=4).generate(requests(20), lambda r, t, n: got.append(r.key))
    # the first to arrive failed (whichever of the four it was); the other three finished and were reported
    refused = next(int(c["body"]["prompt"].split("-")[1]) for c in server.completions())
    assert sorted(got) == sorted({0, 1, 2, 3} - {refused}) and len(server.completions()) == 4


def test_unreachable_endpoint(serve):
    server = serve()
    server.stop()
    with pytest.raises(InputError) as e:
        backend(serve, server).check()
    assert "unreachable after 3 attempts (ConnectError" in str(e.value) and "fix --base-url" in str(e.value)
    with pytest.raises(InputError, match="not an http"):
        OpenAIBackend("127.0.0.1:8000/v1", checkpoint=CKPT, checkpoint_dir=CKPT_DIR, max_model_len=1)


def test_the_api_key_is_sent_and_never_kept(serve, monkeypatch):
    server = serve(key="sk-secret-123")
    with pytest.raises(InputError) as e:
        backend(serve, server).check()
    assert str(e.value).endswith("set OPENAI_API_KEY") and "HTTP 401" in str(e.value)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123")
    b = backend(serve, server)
    assert len(collect(b, requests(3))) == 3
    assert [s["auth"] for s in server.seen[1:]] == ["Bearer sk-secret-123"] * 4
    kept = json.dumps([b.settings(), b.binding(), b.ran]) + repr(vars(b))
    assert "sk-secret" not in kept and "sk-secret" not in repr(b._client.headers)
    monkeypatch.setenv("MY_KEY", "sk-other")
    other = serve(key="sk-other")
    backend(serve, other, api_key_env="MY_KEY").check()
    assert other.seen[0]["auth"] == "Bearer sk-other" and os.environ["OPENAI_API_KEY"] == "sk-secret-123"


def test_a_secret_or_an_absurd_count_in_a_reply_is_not_kept(serve, monkeypatch):
    """A server that echoes the Authorization header into its completion text gets the key masked before the
    prediction is stored; a prompt_tokens no tokenizer could give (negative, more tokens than characters, not an
    integer) is not recorded."""
    counts = [-5, 10**12, True, 7]
    server = serve(key="sk-secret-123", completion=lambda i: (200, None, {
        "choices": [{"index": 0, "text": "echo: Authorization: Bearer sk-secret-123"}],
        "usage": {"prompt_tokens": counts[i]}}))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123")
    got = sorted(collect(backend(serve, server, concurrency=1), requests(4)))
    assert [text for _, text, _ in got] == ["echo: Authorization: Bearer ***"] * 4
    assert [tokens for _, _, tokens in got] == [None, None, None, 7]


def several(serve, servers, **kwargs) -> OpenAIBackend:
    options = {"checkpoint": CKPT, "checkpoint_dir": CKPT_DIR, "max_model_len": 4097, "retry_wait": 0.01, **kwargs}
    b = OpenAIBackend([s.url for s in servers], **options)
    serve.backends.append(b)
    return b


def test_several_endpoints_share_the_requests_and_give_one_servers_answers(serve):
    """Two servers, one of which fails every other completion with 503: every request is answered (a failed one
    at once by the other server), the answers are those one server gives, and both served a share."""
    good = serve()
    flaky = serve(completion=lambda i: (503, {}, {"message": "overloaded"}) if i % 2 == 0 else None)
    alone = collect(backend(serve, serve()), requests(40))
    b = several(serve, [good, flaky], concurrency=2, retries=1)
    got = collect(b, requests(40))
    assert sorted(got) == sorted(alone)
    answered = b.ran["answered"]
    assert answered[good.url] + answered[flaky.url] == 40 and answered[flaky.url] >= 5, answered
    assert sum(s["path"] == "/v1/models" for s in good.seen + flaky.seen) == 2  # each checked once, first
    assert b.binding()["base_url"] == [good.url, flaky.url]
    assert b.settings()["base_url"] == [good.url, flaky.url]


def test_a_slow_endpoint_gets_fewer_requests(serve):
    def slow(i):
        time.sleep(0.2)
        return None

    fast, lagging = serve(), serve(completion=slow)
    b = several(serve, [fast, lagging], concurrency=2)
    collect(b, requests(40))
    assert len(lagging.completions()) < len(fast.completions()) / 3, (len(lagging.completions()),
                                                                      len(fast.completions()))


def test_endpoints_that_serve_other_models_or_fail_are_refused_before_any_completion(serve):
    first = serve()
    other = serve(cards=[{"id": "tiny", "root": "/data/checkpoints/another", "max_model_len": 8192}])
    with pytest.raises(InputError, match=rf"endpoint {other.url} serves 'tiny' \(root '/data/checkpoints/another'\)"):
        several(serve, [first, other], trust_served_model=True).check()
    short = serve(cards=[{"id": "tiny", "root": CKPT_DIR, "max_model_len": 2048}])
    with pytest.raises(InputError, match=rf"endpoint {short.url} serves 'tiny' with max_model_len 2048"):
        several(serve, [first, short]).check()
    assert not first.completions() and not other.completions() and not short.completions()
    with pytest.raises(InputError, match="is given twice"):
        several(serve, [first, first])
    down = serve(completion=lambda i: (503, {}, {"message": "down"}))
    with pytest.raises(InputError) as e:
        collect(several(serve, [down, serve(completion=lambda i: (503, {}, {"message": "down too"}))], retries=2,
                        concurrency=1), requests(1))
    assert str(e.value).startswith(f"endpoints {down.url}, ") and "failed 3 times" in str(e.value)


def test_a_file_of_urls_lists_the_endpoints(serve, tmp_path):
    servers = [serve(), serve()]
    listed = tmp_path / "servers.txt"
    listed.write_text(f"# the two nodes\n{servers[0].url}\n\n  {servers[1].url}  \n")
    b = OpenAIBackend([f"@{listed}"], checkpoint=CKPT, checkpoint_dir=CKPT_DIR, max_model_len=4097)
    serve.backends.append(b)
    assert b.base_url == [s.url for s in servers]
    for content, message in [(None, "cannot read"), ("# none\n\n", "lists no URL"), ("x" * (2 << 20), "over 1 MiB")]:
        path = tmp_path / "bad.txt"
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_text(content)
        with pytest.raises(InputError, match=message):
            OpenAIBackend([f"@{path}"], checkpoint=CKPT, checkpoint_dir=CKPT_DIR, max_model_len=4097)
