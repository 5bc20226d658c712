"""The `openai` backend: any OpenAI-compatible `/v1/completions` endpoint (e.g. `vllm serve`), or several serving
one model (`--base-url` repeated, or `--base-url @FILE` listing them): the load is spread, a failure retried on
another.

One `httpx.Client` per backend, `concurrency` requests in flight per endpoint over kept-alive connections.
Before anything is generated, `check()` asks the server what it serves (`GET /models`) and refuses, in one
line, a server that does not serve this checkpoint or whose context limit is below what the run needs:
vLLM's model cards carry the served name (`id`), what it loaded (`root`) and `max_model_len`.
A request that fails with HTTP 429/5xx, a connection error or a timeout is retried (`Retry-After`
honoured, else exponential backoff); when one fails for good, the requests in flight finish and are
reported before the error is raised, so that a rerun continues from every prediction made.
Every exchange is bounded (`longctx.eval.endpoint`): `--request-timeout` is the time for the whole answer, not
for each read; a body over `MAX_MODELS_BYTES`/`MAX_COMPLETION_BYTES` is not read on; JSON is parsed with
`longctx.core.parse.loads` (nesting bounded). The URL is shown and recorded redacted (`redact_url`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from longctx.core.errors import InputError, SettingError, one_line, ref
from longctx.core.kinds import Bool, Float, Int, Text, Urls
from longctx.core.parse import LimitError, loads
from longctx.core.settings import setting
from longctx.eval.backends import Backend, BackendContext, BackendOptions
from longctx.eval.request import OnResult, Request
from longctx.eval.retry import LONG_WAIT_S, MAX_RETRY_AFTER_S, retry_after

if TYPE_CHECKING:  # httpx and the bounded transport are imported when a backend is made, not with its options
    import httpx

    from longctx.eval.endpoint import BoundedTransport, Endpoint

# The longest wait for a TCP connection and for the `GET /models` probe: a server that is up answers both at
# once, whatever the time one completion takes.
CONNECT_TIMEOUT_S = 10.0
# The longest `Retry-After` the `GET /models` probe waits for: a server asking for more is not ready, and the
# run says so at once rather than sleep before anything has started.
PROBE_MAX_WAIT_S = 10.0
# The largest bodies read: a model list is a few kB, a completion of RULER's budgets (<= 128 tokens, plus a
# thinking budget) a few hundred kB at most.
MAX_MODELS_BYTES = 1 << 20
MAX_COMPLETION_BYTES = 16 << 20


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


@dataclass(frozen=True)
class _Reply:
    """A whole response: its status, headers and body (read within the request's time and size bounds)."""

    status: int
    headers: httpx.Headers
    body: bytes


def _detail(reply: _Reply) -> str:
    """What the server said about a failed request, in one line: the `message` of an OpenAI-style error body
    (`{"error": {"message": ...}}`; vLLM: `{"message": ...}` or `{"detail": ...}`), else the body itself."""
    try:
        doc = loads(reply.body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        for said in (err.get("message") if isinstance(err, dict) else err, doc.get("message"), doc.get("detail")):
            if isinstance(said, str) and said.strip():
                return one_line(said)
    return one_line(reply.body[:4096].decode("utf-8", errors="replace")) or "no detail"


class _GaveUp(Exception):
    """Every attempt at a request failed transiently; the text says how the last one did."""


class _NoAnswer(Exception):
    """A request got no answer (no connection, a timeout, a broken stream); the text says how, in one line."""


@dataclass(frozen=True)
class OpenAIOptions(BackendOptions):
    base_url: list[str] | None = setting(None, Urls(), "openai: endpoint, e.g. http://127.0.0.1:8000/v1 (credential: "
                                                        "OPENAI_API_KEY, or user:password@ in the URL, not both; "
                                                        "recorded and shown redacted). Repeatable, or @FILE (one URL "
                                                        "a line): requests go to the least busy server, a failed one "
                                                        "is retried on another.")
    model: str | None = setting(None, Text(), "openai: model name on the server [default: the first it serves].",
                                flag="--served-model")
    trust_served_model: bool = setting(False, Bool(), "openai: accept a served model whose name and root do not "
                                                      "name the checkpoint (recorded in the results).")
    concurrency: int = setting(8, Int(minimum=1), "openai: requests in flight per server.")
    request_timeout: float = setting(600.0, Float(0, None, low_open=True, words="a number of seconds > 0"),
                                     "openai: seconds to wait for one response.")
    max_retries: int = setting(3, Int(minimum=0), "openai: retries of a failed request (HTTP 429/5xx, connection "
                                                  "errors; Retry-After honoured).")

    def check(self) -> None:
        if not self.base_url:
            raise self.error(f"{ref('backend')} openai needs {ref('base_url')} (e.g. http://127.0.0.1:8000/v1)")


def _refusal(text: str) -> SettingError:
    """A refusal whose `ref()`s name this backend's options (`--base-url`, `backend_options.base_url`)."""
    return SettingError(text, OpenAIOptions)


# The largest file of URLs read (`--base-url @FILE`): a few thousand servers.
MAX_URL_FILE_BYTES = 1 << 20


def _listed(values: list[str]) -> list[str]:
    """`--base-url` values with each `@FILE` replaced by the URLs the file lists (one a line; blank lines and lines
    starting with # skipped)."""
    urls = []
    for value in values:
        if not value.startswith("@"):
            urls.append(value)
            continue
        path = os.path.expanduser(value[1:])
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_URL_FILE_BYTES + 1)
        except OSError as e:
            raise _refusal(f"{ref('base_url')} {value}: cannot read '{path}' ({e.strerror or type(e).__name__}); "
                           "give a file that lists the servers' URLs, one a line") from None
        if len(data) > MAX_URL_FILE_BYTES:
            raise _refusal(f"{ref('base_url')} {value}: '{path}' is over {_mib(MAX_URL_FILE_BYTES)}, the limit for "
                           "a file of URLs")
        lines = [x.strip() for x in data.decode("utf-8", errors="replace").splitlines()]
        found = [x for x in lines if x and not x.startswith("#")]
        if not found:
            raise _refusal(f"{ref('base_url')} {value}: '{path}' lists no URL; one a line, e.g. "
                           "http://127.0.0.1:8000/v1")
        urls += found
    return urls


class OpenAIBackend(Backend):
    """OpenAI-compatible `/v1/completions` endpoints (one or several `base_url`s), greedy, `concurrency` requests
    in flight per endpoint. With several, each attempt of a request goes to the endpoint with the fewest requests
    in flight (a slow server gets fewer), one that failed it is tried again only when every other has failed it
    too, and every endpoint must serve the same model.

    `checkpoint`: the checkpoint as the user gave it (a path or a Hub id); `checkpoint_dir`: the local folder
    it resolved to; `max_model_len`: the tokens this run needs per request. The served model must name the
    checkpoint (its `id` or `root`) unless `trust_served_model`. The credential (`credential` names it) is the
    API key in the environment variable `api_key_env`, read for each request, or the user info of `base_url`
    (refused when both are there, see `longctx.eval.endpoint`); neither is ever printed or stored. `log`
    receives a line when a completion waits long before a retry.
    """

    name = "openai"
    Options = OpenAIOptions
    loads_weights = False  # a served model's weights are the server's

    def __init__(self, base_url: str | list[str], model: str | None = None, *, checkpoint: str, checkpoint_dir: str,
                 max_model_len: int, trust_served_model: bool = False, concurrency: int = 8, timeout: float = 600.0,
                 retries: int = 3, connect_attempts: int = 3, retry_wait: float = 1.0,
                 api_key_env: str = "OPENAI_API_KEY", seed: int = 0, log: Callable[[str], None] | None = None):
        from longctx.eval.endpoint import Endpoint

        urls = _listed([base_url] if isinstance(base_url, str) else list(base_url or []))
        if not urls:
            raise _refusal(f"the openai backend needs {ref('base_url')} (e.g. http://127.0.0.1:8000/v1)")
        self.endpoints = [Endpoint(url, api_key_env, owner=OpenAIOptions) for url in urls]
        servers = [e.server for e in self.endpoints]
        twice = next((e for e in self.endpoints if servers.count(e.server) > 1), None)
        if twice is not None:
            raise _refusal(f"{ref('base_url')} {twice.server} is given twice; give each server once")
        if not timeout > 0:
            raise InputError(f"the request timeout must be > 0 seconds, got {timeout}")
        # redacted: what messages and settings show (one URL, or the list of them)
        self.base_url = self.endpoints[0].shown if len(urls) == 1 else [e.shown for e in self.endpoints]
        self.credential = "; ".join(dict.fromkeys(e.credential for e in self.endpoints))
        self.model = model
        self.checkpoint = checkpoint
        self.checkpoint_dir = checkpoint_dir
        self.max_model_len = max_model_len
        self.trust_served_model = trust_served_model
        self.concurrency = max(1, concurrency)
        self.timeout = float(timeout)
        self.retries = max(0, retries)
        self.connect_attempts = max(1, connect_attempts)
        self.retry_wait = retry_wait
        self.api_key_env = api_key_env
        self.seed = seed
        self.log = log
        self.server: dict[str, Any] | None = None  # the chosen model card: {"id", "root", "max_model_len"}
        self.ran: dict[str, Any] | None = None  # the server reports neither its dtype nor its device
        self._client: httpx.Client | None = None
        self._transport: BoundedTransport | None = None
        self._load = [0] * len(self.endpoints)  # requests in flight at each endpoint
        self._answered = [0] * len(self.endpoints)  # completions each endpoint answered
        self._load_lock = threading.Lock()

    @classmethod
    def create(cls, options: OpenAIOptions, context: BackendContext) -> OpenAIBackend:
        return cls(options.base_url, options.model, checkpoint=context.checkpoint,
                   checkpoint_dir=context.checkpoint_dir, max_model_len=context.max_model_len,
                   trust_served_model=options.trust_served_model, concurrency=options.concurrency,
                   timeout=options.request_timeout, retries=options.max_retries, seed=context.seed, log=context.log)

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "base_url": self.base_url, "model": self.model, "concurrency": self.concurrency,
                "timeout": self.timeout, "retries": self.retries, "trust_served_model": self.trust_served_model,
                "server": self.server}

    def binding(self) -> dict[str, Any]:
        """The options that can change a prediction: the server (its redacted URL without user info: another
        password is the same server; several: their list) and the model they serve (after `check()`);
        `trust_served_model` only when set, so that run directories bound before it existed stay valid."""
        servers = [e.server for e in self.endpoints]
        bound = {"base_url": servers[0] if len(servers) == 1 else servers, "served_model": self.model,
                 "served_root": self.server["root"] if self.server else None}
        if self.trust_served_model:
            bound["trust_served_model"] = True
        return bound

    def close(self) -> None:
        """Close the connections; a later `generate()` opens new ones."""
        if self._client is not None:
            self._client.close()
            self._client = self._transport = None

    def _open(self) -> httpx.Client:
        import httpx

        from longctx.eval.endpoint import BoundedTransport

        if self._client is None:
            # No environment: proxies would bypass the bounded transport, and the credential is the endpoint's.
            self._transport = BoundedTransport(self.concurrency * len(self.endpoints))
            self._client = httpx.Client(transport=self._transport, trust_env=False)
        return self._client

    def _where(self) -> str:
        """The endpoints, as a message names them."""
        if len(self.endpoints) == 1:
            return f"endpoint {self.endpoints[0].shown}"
        return f"endpoints {', '.join(e.shown for e in self.endpoints)}"

    def _failure(self, ep: Endpoint, e: httpx.TransportError, timeout: float) -> str:
        import httpx

        if isinstance(e, httpx.ConnectTimeout):
            return f"ConnectTimeout: no connection within {min(CONNECT_TIMEOUT_S, timeout):g} s"
        if isinstance(e, httpx.TimeoutException):
            return f"{type(e).__name__}: no response within {timeout:g} s"
        text = ep.scrub(one_line(str(e)))
        return f"{type(e).__name__}: {text}" if text else type(e).__name__

    def _exchange(self, ep: Endpoint, method: str, path: str, body: dict | None, timeout: float, max_bytes: int,
                  what: str) -> _Reply:
        """One request and its whole answer, within `timeout` seconds from the start and `max_bytes` of body
        (InputError past them: nothing more is read); `_NoAnswer` saying why when there is none."""
        import httpx

        from longctx.eval.endpoint import read_body

        client = self._open()
        assert self._transport is not None
        limit = httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT_S, timeout))
        try:
            # identity: a compressed body would be inflated past the size bound before it could be counted
            headers = {"Accept-Encoding": "identity", **ep.headers()}
            with self._transport.deadline(timeout), client.stream(method, ep.url(path), json=body, headers=headers,
                                                                  timeout=limit) as resp:
                data = read_body(resp, max_bytes)
                if data is None:
                    raise _refusal(f"endpoint {ep.shown} answered {what} with a body over {_mib(max_bytes)}, "
                                   f"the limit for {what}; is {ref('base_url')} an OpenAI-compatible server?")
                return _Reply(resp.status_code, resp.headers, data)
        except httpx.TransportError as e:
            raise _NoAnswer(self._failure(ep, e, timeout)) from e

    def _pick(self, avoid: set[int]) -> int:
        """The endpoint the next attempt goes to, counted as busier by one until `_done`: the one with the fewest
        requests in flight among those not in `avoid` (all of them when that leaves none)."""
        with self._load_lock:
            choices = [i for i in range(len(self.endpoints)) if i not in avoid] or range(len(self.endpoints))
            i = min(choices, key=lambda j: (self._load[j], j))
            self._load[i] += 1
            return i

    def _done(self, i: int) -> None:
        with self._load_lock:
            self._load[i] -= 1

    def _send(self, method: str, path: str, *, attempts: int, what: str, max_bytes: int, body: dict | None = None,
              timeout: float | None = None, stop: threading.Event | None = None, patience: float = math.inf,
              endpoint: int | None = None) -> tuple[_Reply, Endpoint]:
        """The first answer to `method path` that is not a transient failure (HTTP 429 or 5xx, no connection,
        a timeout) in `attempts` tries, and the endpoint that gave it; `_GaveUp` with the last failure when there
        is none. Each try goes to the endpoint `endpoint` (an index), else to the least busy endpoint that has not
        failed this request since the last wait; once every endpoint has, it waits what the server's
        `Retry-After` asks (at most `MAX_RETRY_AFTER_S`, said when `LONG_WAIT_S` or more; InputError when it asks
        more than `patience`), else `retry_wait * 2**waits`; `stop` ends the waiting."""
        timeout = self.timeout if timeout is None else timeout
        last = ""
        failed: set[int] = set()
        waits = 0
        for attempt in range(attempts):
            i = self._pick(failed) if endpoint is None else endpoint
            ep = self.endpoints[i]
            pause, asked = self.retry_wait * 2**waits, None
            try:
                reply = self._exchange(ep, method, path, body, timeout, max_bytes, what)
            except _NoAnswer as e:
                last = str(e)
            else:
                if reply.status != 429 and reply.status < 500:
                    return reply, ep
                last = f"HTTP {reply.status}: {self._said(ep, reply)}"
                raw = reply.headers.get("Retry-After")
                asked = retry_after(raw, cap=math.inf)
                if asked is not None and asked > patience:
                    raise InputError(f"endpoint {ep.shown} answered {what} with {last} and asked to retry in "
                                     f"{asked:g} s (Retry-After: {one_line(raw, 40)}), longer than the {patience:g} s "
                                     "this check waits; rerun when the server is ready") from None
                pause = pause if asked is None else min(asked, MAX_RETRY_AFTER_S)
            finally:
                if endpoint is None:
                    self._done(i)
            if len(self.endpoints) > 1:
                last = f"{ep.shown}: {last}"
            failed.add(i)
            if attempt + 1 < attempts and (endpoint is not None or len(failed) == len(self.endpoints)):
                failed.clear()
                waits += 1
                if pause >= LONG_WAIT_S and self.log is not None:
                    self.log(f"note: endpoint {ep.shown} answered {what} with {one_line(last, 80)}; retrying in "
                             f"{pause:g} s" + (f" (it asked {asked:g} s; at most {MAX_RETRY_AFTER_S:g} are waited)"
                                               if asked is not None and asked > pause else ""))
                if stop is None:
                    time.sleep(pause)
                elif stop.wait(pause):
                    break
        raise _GaveUp(last)

    def _said(self, ep: Endpoint, reply: _Reply) -> str:
        return ep.scrub(_detail(reply))

    def _refused(self, ep: Endpoint, reply: _Reply, what: str) -> InputError:
        if reply.status in (401, 403):
            fix = (f"check the user name and password in {ref('base_url')}" if ep.credential.startswith("basic") else
                   f"set {self.api_key_env}")
            return _refusal(f"endpoint {ep.shown} refused {what} (HTTP {reply.status}: {self._said(ep, reply)}); "
                            f"{fix}")
        return InputError(f"endpoint {ep.shown} rejected {what} (HTTP {reply.status}: {self._said(ep, reply)})")

    def _parse(self, ep: Endpoint, reply: _Reply, what: str, max_bytes: int) -> Any:
        """The JSON body of `reply` (None when it is not JSON); InputError naming the limit for one nested too
        deep."""
        try:
            return loads(reply.body, max_bytes=max_bytes)
        except LimitError as e:
            raise _refusal(f"endpoint {ep.shown} answered {what} with {e}, over the limit; is {ref('base_url')} "
                           "an OpenAI-compatible server?") from None
        except ValueError:
            return None

    def _names_checkpoint(self, card: dict[str, Any]) -> bool:
        """Whether the card's served name or root is the checkpoint: as the user gave it, the folder it resolved
        to, or (a server on this machine) a path to that same folder."""
        served, root = (v if isinstance(v, str) else None for v in (card.get("id"), card.get("root")))
        if {served, root} & {self.checkpoint, self.checkpoint_dir}:
            return True
        return bool(root) and os.path.exists(root) and os.path.realpath(root) == os.path.realpath(self.checkpoint_dir)

    def check(self) -> None:
        """Ask every endpoint what it serves (bounded retry) and choose the model card: the one `model` names,
        else the first listed. Refuse a card that does not name the checkpoint (unless `trust_served_model`), a
        `max_model_len` below what the run needs, and endpoints that serve different models. Once it has passed,
        later calls do nothing."""
        if self.ran is not None:
            return
        cards = [self._card(i) for i in range(len(self.endpoints))]
        served, root = cards[0].get("id"), cards[0].get("root")
        for ep, card in zip(self.endpoints[1:], cards[1:]):
            if (card.get("id"), card.get("root")) != (served, root):
                raise _refusal(f"endpoint {ep.shown} serves '{card.get('id')}' (root {card.get('root')!r}) and "
                               f"endpoint {self.endpoints[0].shown} '{served}' (root {root!r}); every "
                               f"{ref('base_url')} must serve the same model")
        limits = [card["max_model_len"] for card in cards]
        self.model = served
        self.server = {"id": served, "root": root, "max_model_len": limits[0] if len(set(limits)) == 1 else limits}
        self.ran = {"server": dict(self.server)}

    def _card(self, i: int) -> dict[str, Any]:
        """The model card endpoint `i` serves this run from, checked (see `check`), its `max_model_len` an int or
        None."""
        ep, what = self.endpoints[i], "GET /models"
        try:
            reply, _ = self._send("GET", "/models", attempts=self.connect_attempts, what=what,
                                  max_bytes=MAX_MODELS_BYTES, timeout=min(CONNECT_TIMEOUT_S, self.timeout),
                                  patience=PROBE_MAX_WAIT_S, endpoint=i)
        except _GaveUp as e:
            raise _refusal(f"endpoint {ep.shown} is unreachable after {self.connect_attempts} attempts ({e}); "
                           f"start the server or fix {ref('base_url')}") from None
        if reply.status in (401, 403):
            raise self._refused(ep, reply, what)
        if reply.status != 200:
            raise _refusal(f"endpoint {ep.shown} answered GET /models with HTTP {reply.status} "
                           f"({self._said(ep, reply)}); {ref('base_url')} must be the API root, e.g. "
                           "http://127.0.0.1:8000/v1")
        doc = self._parse(ep, reply, what, MAX_MODELS_BYTES)
        try:
            cards = doc["data"]
            if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise InputError(f"endpoint {ep.shown} answered GET /models without a model list "
                             f"({self._said(ep, reply)}); is it an OpenAI-compatible server?") from None
        ids = [c.get("id") for c in cards]
        listed = ", ".join(repr(i) for i in ids) if ids else "no model"
        if self.model is None:
            if not cards:
                raise InputError(f"endpoint {ep.shown} serves no model; start the server with {self.checkpoint}")
            card = cards[0]
        else:
            card = next((c for c in cards if c.get("id") == self.model), None)
            if card is None:
                hint = (f"; pass {ref('model')} {ids[0]}" if len(ids) == 1 else
                        f"; pass {ref('model')} with one of them" if ids else "")
                raise _refusal(f"endpoint {ep.shown} does not serve '{self.model}': it serves {listed}{hint}")
        served, root = card.get("id"), card.get("root")
        if not self.trust_served_model and not self._names_checkpoint(card):
            expected = repr(self.checkpoint) + (f" (at {self.checkpoint_dir})"
                                                if self.checkpoint_dir != self.checkpoint else "")
            raise _refusal(f"endpoint {ep.shown} serves '{served}' (root {root!r}), not the checkpoint "
                           f"{expected}; start the server with this checkpoint, or pass {ref('trust_served_model')} "
                           "if it is the same model under another name")
        have = card.get("max_model_len")
        # Servers other than vLLM do not report their context limit: then it cannot be checked here.
        have = have if isinstance(have, int) and not isinstance(have, bool) else None
        if have is not None and have < self.max_model_len:
            from longctx.eval.settings import RulerRunSettings  # owns `lengths`; it imports this module

            raise SettingError(f"endpoint {ep.shown} serves '{served}' with max_model_len {have}, but this run "
                               f"needs {self.max_model_len} tokens (its longest length with the generation budget "
                               f"and special tokens); restart the server with --max-model-len {self.max_model_len} "
                               f"or more, or use shorter {ref('lengths')}", RulerRunSettings)
        return {**card, "max_model_len": have}

    def _complete(self, r: Request, stop: threading.Event) -> tuple[str, int | None]:
        # Greedy as upstream RULER: no stop words (the API's default), the task's generation budget.
        body = {"model": self.model, "prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0.0,
                "top_p": 1.0, "seed": self.seed}
        attempts = self.retries + 1
        what = "a completion request"
        try:
            reply, ep = self._send("POST", "/completions", attempts=attempts, what=what,
                                   max_bytes=MAX_COMPLETION_BYTES, body=body, stop=stop)
        except _GaveUp as e:
            raise InputError(f"{self._where()} failed {attempts} time{'s' if attempts > 1 else ''} ({e}); "
                             "the predictions made so far are kept: rerun the same command to continue") from None
        if reply.status != 200:
            raise self._refused(ep, reply, what)
        doc = self._parse(ep, reply, what, MAX_COMPLETION_BYTES)
        try:
            text = doc["choices"][0]["text"]
            if not isinstance(text, str):
                raise TypeError
        except (ValueError, KeyError, IndexError, TypeError):
            raise InputError(f"endpoint {ep.shown} answered a completion request without choices[0].text "
                             f"({self._said(ep, reply)})") from None
        usage = doc.get("usage")
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        # a count no tokenizer gives (a token is at least a character, beside a few special tokens) is not recorded
        plausible = isinstance(tokens, int) and not isinstance(tokens, bool) and 0 < tokens <= len(r.prompt) + 16
        # a server (or a proxy) that echoes the request's Authorization header into its text must not put the key
        # in the prediction files
        with self._load_lock:
            self._answered[self.endpoints.index(ep)] += 1
        return ep.scrub(text), tokens if plausible else None

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        """Complete `requests`, `concurrency` at a time per endpoint, reporting each as it finishes. When one fails
        for good, no new request is sent; those in flight finish and are reported, then the first failure is
        raised."""
        self.check()
        self._open()
        it = iter(requests)
        stop = threading.Event()
        error: InputError | None = None
        workers = self.concurrency * len(self.endpoints)
        pool = ThreadPoolExecutor(workers, thread_name_prefix="longctx-openai")
        pending: dict[Future, Request] = {}

        def submit(n: int) -> None:
            for r in islice(it, n):
                pending[pool.submit(self._complete, r, stop)] = r

        try:
            submit(workers)
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    r = pending.pop(fut)
                    try:
                        text, tokens = fut.result()
                    except InputError as e:
                        error = error or e
                        continue
                    on_result(r, text, tokens)
                    if error is None:
                        submit(1)
        except BaseException:
            # Interrupted, or on_result failed: nothing more can be reported, so nothing more is waited for.
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        if len(self.endpoints) > 1 and self.ran is not None:  # how the load was spread
            self.ran["answered"] = {e.shown: n for e, n in zip(self.endpoints, self._answered)}
        if error is not None:
            raise error
