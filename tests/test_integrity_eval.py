"""Issue 29 for evaluation (`longctx ruler`, its report and `compare`'s per-sample statistics), with real HTTP
servers on 127.0.0.1 (threads in this process), real tiny checkpoints, real tokenizers and chat templates:

- 3: no credential of `--base-url` (user info, query) or OPENAI_API_KEY is stored in any file of the run, or
  printed, whatever the server does; the credential used is named in one line;
- 4: a score comes only from what longctx generated and what the task file holds;
- 7: every answer of an endpoint is bounded in nesting, size and time, and a chat template's rendering in time;
- 9: a checkpoint whose weights do not match its config is refused before the run directory is made, for
  every backend.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from http_helpers import QuietHandler, send

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.eval.binding import RUN_FILE
from longctx.eval.endpoint import redact_url
from longctx.eval.request import Request

PASSWORD, QUERY_SECRET, KEY = "pw-5ecret-A1", "q-5ecret-B2", "sk-5ecret-C3"
SECRETS = (PASSWORD, QUERY_SECRET, KEY, base64.b64encode(f"alice:{PASSWORD}".encode()).decode())


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_error_line(r, *said: str) -> None:
    """Exit 2, one `Error: ...` line ending stderr (past any progress bar a generation drew) holding every text
    of `said`, no traceback."""
    assert r.exit_code == 2, (r.output, r.exception)
    lines = r.stderr.replace("\r", "\n").strip().splitlines()
    assert "Traceback" not in r.output and lines[-1].startswith("Error: "), r.stderr
    assert sum(line.startswith("Error: ") for line in lines) == 1, r.stderr
    for text in said:
        assert text in lines[-1], r.stderr


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def assert_no_secret(*texts: str | bytes) -> None:
    for text in texts:
        data = text.encode() if isinstance(text, str) else text
        for secret in SECRETS:
            assert secret.encode() not in data, (secret, data[:2000])


# --- a real OpenAI-compatible server ---------------------------------------------------------------------


class Server:
    """`GET /v1/models` lists `cards`; `POST /v1/completions` answers `reply`. `plan(path, count)` (count: the
    requests to that path so far, from 0) may return a function `respond(handler)` that answers instead
    (it writes to the socket itself: trickles, endless bodies). With `auth` set (the Authorization values
    accepted) any other request gets 401 with a body that echoes the request line and its Authorization, as a
    careless server does. Every request is recorded in `seen` (path, Authorization)."""

    def __init__(self, cards=None, reply="nothing", plan=None, auth=None):
        self.cards = cards or [{"id": "tiny", "root": "/nowhere", "max_model_len": 8192}]
        self.reply, self.plan, self.auth = reply, plan, auth
        self.seen: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def _handle(self):
                raw = self.read_body()
                body = json.loads(raw) if raw else None
                path = self.path.partition("?")[0]
                with server.lock:
                    count = sum(p == path for p, _ in server.seen)
                    server.seen.append((path, self.headers.get("Authorization")))
                try:
                    if server.auth is not None and self.headers.get("Authorization") not in server.auth:
                        echo = f"bad credentials for {self.command} {self.path}: {self.headers.get('Authorization')}"
                        return send(self, 401, {"error": {"message": echo}})
                    planned = server.plan(path, count) if server.plan else None
                    if planned is not None:
                        return planned(self)
                    if path == "/v1/models":
                        return send(self, 200, {"object": "list", "data": server.cards})
                    send(self, 200, {"choices": [{"index": 0, "text": server.reply}],
                                     "usage": {"prompt_tokens": len(body["prompt"])}})
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            do_GET = do_POST = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def requests(self, path: str) -> int:
        with self.lock:
            return sum(p == path for p, _ in self.seen)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()




@pytest.fixture
def serve(monkeypatch):
    """serve(**Server options) -> a running Server, stopped at the end of the test; no OPENAI_API_KEY."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    servers: list[Server] = []

    def start(**kwargs) -> Server:
        servers.append(Server(**kwargs))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, reference_tokenizer_dir) -> Path:
    """A tiny Qwen3 with a 4096-token context (RULER's 1k tasks fit)."""
    from longctx.init.presets import write_tiny_qwen3

    return Path(write_tiny_qwen3(tmp_path_factory.mktemp("integrity-eval") / "tiny", reference_tokenizer_dir,
                                 max_position_embeddings=4096))


def ruler_args(ckpt, out, *extra, tasks="niah_single_1,vt"):
    return ["ruler", ckpt, "--lengths", "1k", "--tasks", tasks, "--samples", "2", "--no-plot", "-o", out, *extra]


def card(ckpt) -> list[dict]:
    return [{"id": "tiny", "root": str(ckpt), "max_model_len": 8192}]


# --- 3. no credential is stored or printed ---------------------------------------------------------------


def test_redact_url_masks_user_info_query_values_and_fragments():
    cases = {
        "http://127.0.0.1:8000/v1": "http://127.0.0.1:8000/v1",
        f"http://alice:{PASSWORD}@host:8000/v1": "http://***@host:8000/v1",
        f"https://{KEY}@host/v1": "https://***@host/v1",
        f"http://a:p@ss@host/v1?api-version=2024&sig={QUERY_SECRET}&flag": "http://***@host/v1?api-version=***&sig=***&***",
        f"http://host/v1#{KEY}": "http://host/v1#***",
        f"http://[::1/v1?key={KEY}": "***",  # does not parse: nothing of it is shown
    }
    for url, shown in cases.items():
        assert redact_url(url) == shown, url
    assert redact_url(f"http://alice:{PASSWORD}@host:8000/v1?k={KEY}", userinfo=False) == "http://host:8000/v1?k=***"


BASIC = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()


def _fail_completions(path, count):
    if path == "/v1/completions":
        return lambda h: send(h, 500, {"message": f"overloaded, retry {h.path}"})
    return None


def _unreachable(server):
    server.stop()


# (name, server options, extra ruler options, what the one error line says; None: the run succeeds)
SECRET_CASES = [
    ("ok", {}, [], None),
    ("unreachable", {"after": _unreachable}, [], "unreachable after 3 attempts"),
    ("401", {"auth": ["Basic nobody"]}, [], "HTTP 401"),
    ("500 with retries", {"plan": _fail_completions}, ["--max-retries", "1"], "failed 2 times (HTTP 500"),
    ("wrong model", {"cards": [{"id": "other", "root": "/models/other", "max_model_len": 8192}]}, [],
     "serves 'other'"),
]


@pytest.mark.parametrize("name,options,extra,error", SECRET_CASES, ids=[c[0] for c in SECRET_CASES])
@pytest.mark.slow
def test_no_secret_of_the_url_is_stored_or_printed(name, options, extra, error, serve, ckpt, tmp_path):
    options = dict(options)
    after = options.pop("after", None)
    server = serve(**{"cards": card(ckpt), "auth": [BASIC], **options})
    if after is not None:
        after(server)
    url = f"http://alice:{PASSWORD}@127.0.0.1:{server.port}/v1?api_key={QUERY_SECRET}"
    out = tmp_path / "run"
    r = run(*ruler_args(ckpt, out, "--backend", "openai", "--base-url", url, *extra))
    assert_no_secret(r.output, r.stderr, str(r.exception or ""), *files_under(tmp_path).values())
    if error is None:
        assert r.exit_code == 0, r.output
        assert "credential: basic auth from the user info of --base-url" in r.stdout.splitlines()
        shown = f"http://***@127.0.0.1:{server.port}/v1?api_key=***"
        for name_ in ("scores.json", "results.json"):
            assert json.loads((out / name_).read_text())["backend"]["base_url"] == shown
        run_file = json.loads((out / RUN_FILE).read_text())
        assert run_file["binding"]["engine"]["base_url"] == f"http://127.0.0.1:{server.port}/v1?api_key=***"
        # another password is the same server: the run continues, nothing predicted again
        server.auth = ["Basic " + base64.b64encode(b"alice:other-password").decode()]
        again = run(*ruler_args(ckpt, out, "--backend", "openai", "--base-url", url.replace(PASSWORD, "other-password")))
        assert again.exit_code == 0 and "0 new predictions (4 reused)" in again.output, again.output
        return
    one_error_line(r, error)
    if name == "500 with retries":  # the run directory was made: nothing in it holds a secret (checked above)
        assert (out / RUN_FILE).is_file()
    else:
        assert not out.exists()


@pytest.mark.slow
def test_the_credential_is_named_and_one_rule_decides_between_key_and_user_info(serve, ckpt, tmp_path,
                                                                                 monkeypatch):
    server = serve(cards=card(ckpt), auth=[f"Bearer {KEY}"])
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    r = run(*ruler_args(ckpt, tmp_path / "key", "--backend", "openai", "--base-url", server.url))
    assert r.exit_code == 0 and "credential: OPENAI_API_KEY (Bearer)" in r.stdout.splitlines(), r.output
    assert_no_secret(r.output, *files_under(tmp_path).values())
    # user info and a key: a request carries one Authorization header, so neither is chosen silently
    url = f"http://alice:{PASSWORD}@127.0.0.1:{server.port}/v1"
    r = run(*ruler_args(ckpt, tmp_path / "both", "--backend", "openai", "--base-url", url))
    one_error_line(r, "holds a user name and password (basic auth) and OPENAI_API_KEY is set",
                   "drop the user info from --base-url or unset OPENAI_API_KEY")
    assert_no_secret(r.output)
    assert not (tmp_path / "both").exists()
    monkeypatch.delenv("OPENAI_API_KEY")
    open_server = serve(cards=card(ckpt))
    r = run(*ruler_args(ckpt, tmp_path / "none", "--backend", "openai", "--base-url", open_server.url))
    assert r.exit_code == 0 and "credential: none" in r.stdout.splitlines(), r.output
    assert all(auth is None for _, auth in open_server.seen)


def test_a_secret_the_server_echoes_is_masked_in_every_failure(serve):
    """Backend level: the exception texts themselves, for each way a server fails."""
    from longctx.eval.backends.openai import OpenAIBackend

    def trickle(h):
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        for _ in range(1000):
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.05)

    plans = {
        "404 echo": lambda path, n: (lambda h: send(h, 404, {"detail": f"no route {h.path}"})),
        "bad body echo": lambda path, n: None if path == "/v1/models" else (lambda h: send(h, 200, raw=h.path.encode())),
        "timeout": lambda path, n: None if path == "/v1/models" else trickle,
    }
    for name, plan in plans.items():
        server = serve(cards=[{"id": "tiny", "root": "/x"}], plan=plan)
        url = f"http://alice:{PASSWORD}@127.0.0.1:{server.port}/v1?api_key={QUERY_SECRET}"
        b = OpenAIBackend(url, checkpoint="/x", checkpoint_dir="/x", max_model_len=10, retries=0, timeout=0.5)
        with pytest.raises(InputError) as e:
            b.generate([Request(0, "p", 1)], lambda *a: None)
        b.close()
        assert_no_secret(str(e.value), repr(vars(b)))
        assert f"http://***@127.0.0.1:{server.port}/v1?api_key=***" in str(e.value), (name, str(e.value))
        assert "\n" not in str(e.value)


# --- 4. a score comes only from what longctx generated and what the task file holds -----------------------


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def vt_score(out: Path) -> float:
    return next(row["score"] for row in json.loads((out / "scores.json").read_text())["scores"] if row["task"] == "vt")


@pytest.mark.slow
def test_a_score_comes_from_the_task_file_and_predictions_of_its_prompts(serve, ckpt, tmp_path):
    from longctx.report.results import load_results
    from longctx.report.run import write_report
    from longctx.report.samples import run_samples

    server = serve(cards=card(ckpt), reply="nothing")
    out = tmp_path / "run"
    args = ruler_args(ckpt, out, "--backend", "openai", "--base-url", server.url, tasks="vt")
    assert run(*args).exit_code == 0 and vt_score(out) == 0.0
    pred, tasks = out / "pred" / "1024" / "vt.jsonl", jsonl(out / "tasks" / "1024" / "vt.jsonl")
    # edited references in the prediction file: no score follows them, neither the run's nor the report's
    edited = [{**rec, "outputs": ["nothing"]} for rec in jsonl(pred)]
    write_jsonl(pred, edited)
    rep = write_report(out, plot=False)  # before any rerun: the per-sample scores agree with scores.json
    assert rep.results["intervals"] is not None and not rep.notes
    assert run_samples(out, load_results(out))["vt"][1024].scores == [0.0, 0.0]
    r = run(*args)
    assert r.exit_code == 0 and "0 new predictions (2 reused)" in r.output and vt_score(out) == 0.0, r.output
    # a prediction of another prompt (its hash changed, or none) is not one: the report has no per-sample
    # scores for it, and a rerun predicts it again and says so
    edited[0]["prompt_sha256"] = hashlib.sha256(b"another prompt").hexdigest()
    del edited[1]["prompt_sha256"]
    write_jsonl(pred, edited)
    assert run_samples(out, load_results(out)) is None
    sent = server.requests("/v1/completions")
    r = run(*args)
    assert r.exit_code == 0 and "2 new predictions (0 reused)" in r.output, r.output
    assert ("note: 2 prediction(s) were not made from their task line's prompt (prompt_sha256 differs or is "
            "missing: vt at 1024: 2); they are predicted again") in r.stdout.splitlines()
    assert server.requests("/v1/completions") == sent + 2 and vt_score(out) == 0.0
    # the run directory is trusted for `pred` itself: a prediction of the right prompt scores as it stands
    fixed = [{**rec, "pred": " ".join(tasks[rec["index"]]["outputs"])} for rec in jsonl(pred)]
    write_jsonl(pred, fixed)
    r = run(*args)
    assert r.exit_code == 0 and "0 new predictions (2 reused)" in r.output and vt_score(out) == 100.0, r.output


# --- 7. every parse is bounded ---------------------------------------------------------------------------


def _raw(status: int, body: bytes, headers=None):
    return lambda h: send(h, status, raw=body, headers=headers)


def _endless(h):
    """A chunked body that would go on for 64 MiB (16 MiB is the limit): reading must stop at the limit."""
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    chunk = b'"' + b"x" * (1 << 16) + b'"'
    for _ in range(1024):
        h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    h.wfile.write(b"0\r\n\r\n")


def _declared_over(h):
    """A Content-Length of 17 MiB (16 MiB is the limit): refused before a byte of the body is read."""
    h.send_response(200)
    h.send_header("Content-Length", str(17 << 20))
    h.end_headers()
    h.wfile.write(b"{}")


def _trickle_body(h):
    """A whole answer, one byte every 0.05 s (about 5 s): past a 1-second request timeout."""
    body = json.dumps({"choices": [{"text": "late"}]}).encode() + b" " * 60
    h.send_response(200)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    for i in range(len(body)):
        h.wfile.write(body[i:i + 1])
        h.wfile.flush()
        time.sleep(0.05)


def _trickle_headers(h):
    """The status line and headers, one byte every 0.05 s (about 5 s)."""
    body = json.dumps({"choices": [{"text": "late"}]}).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nX-Padding: {'p' * 40}\r\n\r\n".encode()
    for i in range(len(head)):
        h.wfile.write(head[i:i + 1])
        h.wfile.flush()
        time.sleep(0.05)
    h.wfile.write(body)


NESTED = b"[" * 5000 + b"]" * 5000
# (name, path answered, how, what the error says)
BOUND_CASES = [
    ("models nested", "/v1/models", _raw(200, NESTED), "answered GET /models with JSON nested deeper than 100 levels"),
    ("completion nested", "/v1/completions", _raw(200, NESTED),
     "answered a completion request with JSON nested deeper than 100 levels"),
    ("models over 1 MiB", "/v1/models", _raw(200, b'"' + b"x" * (2 << 20) + b'"'),
     "answered GET /models with a body over 1 MiB, the limit for GET /models"),
    ("completion declared over 16 MiB", "/v1/completions", _declared_over,
     "answered a completion request with a body over 16 MiB"),
    ("completion streamed past 16 MiB", "/v1/completions", _endless,
     "answered a completion request with a body over 16 MiB"),
    ("trickled body", "/v1/completions", _trickle_body, "failed 1 time (ReadTimeout: no response within 1 s)"),
    ("trickled headers", "/v1/completions", _trickle_headers, "failed 1 time (ReadTimeout: no response within 1 s)"),
    ("Retry-After on the probe", "/v1/models", _raw(503, b'{"message": "loading"}', {"Retry-After": "99999"}),
     "answered GET /models with HTTP 503: loading and asked to retry in 99999 s (Retry-After: 99999), longer "
     "than the 10 s this check waits; rerun when the server is ready"),
]


@pytest.mark.parametrize("name,path,how,said", BOUND_CASES, ids=[c[0] for c in BOUND_CASES])
@pytest.mark.slow
def test_every_answer_of_an_endpoint_is_bounded(name, path, how, said, serve):
    from longctx.eval.backends.openai import OpenAIBackend

    server = serve(cards=[{"id": "tiny", "root": "/x"}], plan=lambda p, n: how if p == path else None)
    b = OpenAIBackend(server.url, checkpoint="/x", checkpoint_dir="/x", max_model_len=10, retries=0, timeout=1.0)
    with pytest.raises(InputError) as e:
        b.generate([Request(0, "p", 1)], lambda *a: None)
    b.close()
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert server.requests("/v1/models") == 1  # refused at once, never retried into a long wait


def test_a_long_wait_before_retrying_a_completion_is_said(serve, monkeypatch):
    from longctx.eval.backends import openai as openai_backend
    from longctx.eval.backends.openai import OpenAIBackend

    monkeypatch.setattr(openai_backend, "LONG_WAIT_S", 0.5)
    monkeypatch.setattr(openai_backend, "MAX_RETRY_AFTER_S", 1.0)
    busy = _raw(429, b'{"error": {"message": "busy"}}', {"Retry-After": "99999"})
    server = serve(cards=[{"id": "tiny", "root": "/x"}],
                   plan=lambda p, n: busy if p == "/v1/completions" and n == 0 else None)
    said: list[str] = []
    b = OpenAIBackend(server.url, checkpoint="/x", checkpoint_dir="/x", max_model_len=10, log=said.append)
    got = []
    b.generate([Request(0, "p", 1)], lambda r, text, n: got.append(text))
    b.close()
    assert got == ["nothing"]
    assert said == [f"note: endpoint {server.url} answered a completion request with HTTP 429: busy; retrying in "
                    "1 s (it asked 99999 s; at most 1 are waited)"]


LOOPS = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
         "{% for m in messages %}{{ m['content'] }}{% endfor %}")


@pytest.fixture
def looping_checkpoint(ckpt, tmp_path) -> Path:
    """The tiny checkpoint with a chat template whose loops would run 10^10 times."""
    import shutil

    from transformers import AutoTokenizer

    out = tmp_path / "looping"
    shutil.copytree(ckpt, out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = LOOPS
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("verb", ["prepare", "run"])
@pytest.mark.slow
def test_a_chat_template_that_would_render_forever_is_stopped_at_the_limit(verb, looping_checkpoint, tmp_path,
                                                                         monkeypatch):
    from ruler_tasks import templates

    monkeypatch.setattr(templates, "RENDER_LIMIT_S", 0.5)
    out = tmp_path / "out"
    if verb == "prepare":
        args = ["ruler", "prepare", "--tokenizer", looping_checkpoint, "--lengths", "1k", "--tasks", "vt",
                "--samples", "1", "--template", "chat", "-o", out]
    else:
        args = [*ruler_args(looping_checkpoint, out, "--backend", "hf", "--template", "chat", tasks="vt")]
    r = run(*args)
    one_error_line(r, "the tokenizer's chat template did not finish rendering one message within 0.5 s of CPU time (the "
                      "limit)")
    assert not out.exists()


@pytest.mark.slow
def test_what_a_server_sends_is_stored_and_shown_as_text(serve, ckpt, tmp_path):
    """A completion holding a lone surrogate (JSON "\\ud800", which no file encoding takes) is stored with U+FFFD,
    and export reads it back; an error whose text carries escape sequences and line breaks is one printable
    line."""
    server = serve(cards=card(ckpt), reply="caf\udce9 \ud83d\ude00")
    out = tmp_path / "run"
    assert run(*ruler_args(ckpt, out, "--backend", "openai", "--base-url", server.url, tasks="vt")).exit_code == 0
    preds = jsonl(out / "pred" / "1024" / "vt.jsonl")
    assert {p["pred"] for p in preds} == {"caf\ufffd \U0001f600"}
    for fmt, target in (("lm-eval", tmp_path / "r.json"), ("ruler", tmp_path / "ruler")):
        r = run("export", out, "--format", fmt, "-o", target)
        assert r.exit_code == 0, r.output

    def fails(handler):
        send(handler, 400, {"error": {"message": "bad\x1b]0;owned\x07 request\n\x1b[2Jcleared"}})

    loud = serve(cards=card(ckpt), plan=lambda path, count: fails if path == "/v1/completions" else None)
    r = run(*ruler_args(ckpt, tmp_path / "loud", "--backend", "openai", "--base-url", loud.url, tasks="vt"))
    assert r.exit_code != 0 and "\x1b" not in r.stderr and "\x07" not in r.stderr, r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1 and "bad\\x1b]0;owned\\x07 request \\x1b[2Jcleared" in error[0], r.stderr


def test_a_refusal_found_while_writing_does_not_wait_for_the_engine_start(ckpt, tmp_path, monkeypatch):
    """The task files are written while the backend starts: a refusal the writing finds (after the checks made
    before it) ends the run at once, in its own line, instead of after the start (a minute for vLLM's engine)."""
    from longctx.eval import runner
    from longctx.eval.backends.hf import HfBackend
    from ruler_tasks.errors import RulerInputError

    def slow_load(self):
        time.sleep(120)

    def refusing_prepare(*args, on_checked=None, **kwargs):
        on_checked()
        time.sleep(0.5)  # the start is under way
        raise RulerInputError("a refusal found while writing the task files")

    monkeypatch.setattr(HfBackend, "_load", slow_load)
    monkeypatch.setattr(runner, "prepare", refusing_prepare)
    started = time.monotonic()
    r = run(*ruler_args(ckpt, tmp_path / "run", "--backend", "hf", tasks="vt"))
    one_error_line(r, "a refusal found while writing the task files")
    assert time.monotonic() - started < 30
    assert not (tmp_path / "run").exists()


def test_a_chat_template_that_writes_without_end_is_stopped_at_the_size_limit(reference_tokenizer_dir, monkeypatch):
    """Output, not time: a template whose loops write 10^10 pieces is stopped once it has written the limit, and the
    line says so (not "loops" and not a memory error)."""
    from transformers import AutoTokenizer

    from ruler_tasks import templates
    from ruler_tasks.errors import RulerInputError

    monkeypatch.setattr(templates, "RENDER_LIMIT_CHARS", 100_000)
    tok = AutoTokenizer.from_pretrained(reference_tokenizer_dir)
    tok.chat_template = LOOPS.replace("{% endfor %}{% endfor %}", "words {% endfor %}{% endfor %}", 1)
    with pytest.raises(RulerInputError, match="chat template wrote more than 100,000 characters around one message "
                                              r"\(the limit\); fix what it writes in its loops"):
        templates.model_template("chat", tok)


# --- 9. refusals leave nothing: weights that do not match the config -------------------------------------


def _mismatched(ckpt: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "mismatched"
    shutil.copytree(ckpt, out)
    config = json.loads((out / "config.json").read_text())
    config["hidden_size"] *= 2  # the weight files hold 128-wide tensors
    (out / "config.json").write_text(json.dumps(config))
    return out


BACKEND_CASES = {"hf": [], "vllm": [], "openai": ["--base-url", "SERVER"]}


def test_every_backend_is_in_the_weights_table():
    from longctx.eval.backends import registry

    assert set(BACKEND_CASES) == set(registry())


@pytest.mark.parametrize("backend", sorted(BACKEND_CASES))
def test_weights_that_do_not_match_the_config_are_refused_before_the_run_directory_is_made(backend, serve, ckpt,
                                                                                          tmp_path):
    bad = _mismatched(ckpt, tmp_path)
    server = serve(cards=card(bad))
    extra = [server.url if a == "SERVER" else a for a in BACKEND_CASES[backend]]
    out = tmp_path / "deep" / "run"
    r = run(*ruler_args(bad, out, "--backend", backend, *extra))
    one_error_line(r, "has shape [32000, 128] in the weight files but [32000, 256] in the model config.json "
                      "describes; the weights and config.json are from different models")
    assert not (tmp_path / "deep").exists() and server.requests("/v1/completions") == 0


def test_a_url_is_recorded_redacted_wherever_settings_are_written():
    """Settings are written down by `record()` (provenance) and by a recipe's stage marker and hash
    (`section_record`): a URL in them is redacted there, while the job the stage runs keeps the real one."""
    from longctx.eval.settings import RulerRunSettings
    from longctx.recipe.plan import as_job, section_record

    url = f"http://alice:{PASSWORD}@host:8000/v1?k={QUERY_SECRET}"
    other = f"http://bob:{PASSWORD}@other:8000/v1"
    s = RulerRunSettings(checkpoint="c", lengths=[4096], output="o", backend="openai", base_url=[url, other])
    for written in (s.record(), section_record(s)):
        text = json.dumps(written)
        assert PASSWORD not in text and QUERY_SECRET not in text and "http://***@host:8000/v1?k=***" in text
        assert "http://***@other:8000/v1" in text
    assert as_job(s, RulerRunSettings, checkpoint="c", output="o").base_url == [url, other]
