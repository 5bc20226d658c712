"""The `openai` backend: any OpenAI-compatible `/v1/completions` endpoint (e.g. `vllm serve`).

One `httpx.Client` per backend, `concurrency` requests in flight over as many kept-alive connections.
Before anything is generated, `check()` asks the server what it serves (`GET /models`) and refuses, in one
line, a server that does not serve this checkpoint or whose context limit is below what the run needs:
vLLM's model cards carry the served name (`id`), what it loaded (`root`) and `max_model_len`.
A request that fails with HTTP 429/5xx, a connection error or a timeout is retried (`Retry-After`
honoured, else exponential backoff); when one fails for good, the requests in flight finish and are
reported before the error is raised, so that a rerun continues from every prediction made.
"""

from __future__ import annotations

import email.utils
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from itertools import islice
from typing import Any

import httpx

from longctx.core.errors import InputError
from longctx.eval.request import OnResult, Request

# The longest `Retry-After` honoured: a server (or a proxy in front of it) asking for more would stall the run
# with no sign of life; past this the request is retried anyway, and fails like any other when it is refused.
MAX_RETRY_AFTER_S = 300.0
# The longest wait for a TCP connection and for the `GET /models` probe: a server that is up answers both at
# once, whatever the time one completion takes.
CONNECT_TIMEOUT_S = 10.0


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """The seconds a `Retry-After` header asks to wait (RFC 9110 §10.2.3: delay-seconds or an HTTP-date),
    at most `MAX_RETRY_AFTER_S`; None when there is no header or it says neither."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # an HTTP-date is always GMT; "-0000" parses to a naive datetime
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _detail(resp: httpx.Response) -> str:
    """What the server said about a failed request, in one line: the `message` of an OpenAI-style error body
    (`{"error": {"message": ...}}`; vLLM: `{"message": ...}` or `{"detail": ...}`), else the body itself."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        for said in (err.get("message") if isinstance(err, dict) else err, doc.get("message"), doc.get("detail")):
            if isinstance(said, str) and said.strip():
                return _one_line(said)
    try:
        return _one_line(resp.text) or "no detail"
    except (UnicodeDecodeError, LookupError):
        return "an undecodable body"


class _GaveUp(Exception):
    """Every attempt at a request failed transiently; the text says how the last one did."""


class OpenAIBackend:
    """An OpenAI-compatible `/v1/completions` endpoint, greedy, `concurrency` requests in flight.

    `checkpoint`: the checkpoint as the user gave it (a path or a Hub id); `checkpoint_dir`: the local folder
    it resolved to; `max_model_len`: the tokens this run needs per request. The served model must name the
    checkpoint (its `id` or `root`) unless `trust_served_model`. The API key comes from the environment
    variable `api_key_env`, read for each request; it is never printed or stored.
    """

    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, *, checkpoint: str, checkpoint_dir: str,
                 max_model_len: int, trust_served_model: bool = False, concurrency: int = 8, timeout: float = 600.0,
                 retries: int = 3, connect_attempts: int = 3, retry_wait: float = 1.0,
                 api_key_env: str = "OPENAI_API_KEY", seed: int = 0):
        if not base_url:
            raise InputError("the openai backend needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        try:
            url = httpx.URL(base_url)
        except httpx.InvalidURL:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise InputError(f"--base-url '{base_url}' is not an http(s) URL; e.g. http://127.0.0.1:8000/v1")
        if not timeout > 0:
            raise InputError(f"the request timeout must be > 0 seconds, got {timeout}")
        self.base_url = base_url.rstrip("/")
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
        self.server: dict[str, Any] | None = None  # the chosen model card: {"id", "root", "max_model_len"}
        self.ran: dict[str, Any] | None = None  # the server reports neither its dtype nor its device
        self._client: httpx.Client | None = None

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "base_url": self.base_url, "model": self.model, "concurrency": self.concurrency,
                "timeout": self.timeout, "retries": self.retries, "trust_served_model": self.trust_served_model,
                "server": self.server}

    def binding(self) -> dict[str, Any]:
        """The options that can change a prediction: the server and the model it serves (after `check()`);
        `trust_served_model` only when set, so that run directories bound before it existed stay valid."""
        bound = {"base_url": self.base_url, "served_model": self.model,
                 "served_root": self.server["root"] if self.server else None}
        if self.trust_served_model:
            bound["trust_served_model"] = True
        return bound

    def close(self) -> None:
        """Close the connections; a later `generate()` opens new ones."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _open(self) -> httpx.Client:
        if self._client is None:
            # httpx's read timeout bounds each wait for bytes from the server; a completion that is not streamed
            # comes in one piece once generated, so it is the wait for the whole response.
            self._client = httpx.Client(
                timeout=httpx.Timeout(self.timeout, connect=min(CONNECT_TIMEOUT_S, self.timeout)),
                limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency))
        return self._client

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _failure(self, e: httpx.TransportError, timeout: float) -> str:
        if isinstance(e, httpx.ConnectTimeout):
            return f"ConnectTimeout: no connection within {min(CONNECT_TIMEOUT_S, timeout):g} s"
        if isinstance(e, httpx.ReadTimeout):
            return f"ReadTimeout: no response within {timeout:g} s"
        text = _one_line(str(e))
        return f"{type(e).__name__}: {text}" if text else type(e).__name__

    def _send(self, method: str, path: str, attempts: int, body: dict | None = None, timeout: float | None = None,
              stop: threading.Event | None = None) -> httpx.Response:
        """The first response to `method path` that is not a transient failure (HTTP 429 or 5xx, no connection,
        a timeout) in `attempts` tries; `_GaveUp` with the last failure when there is none. Between tries it
        waits what the server's `Retry-After` asks, else `retry_wait * 2**attempt`; `stop` ends the waiting."""
        client = self._open()
        limit = (httpx.USE_CLIENT_DEFAULT if timeout is None else
                 httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT_S, timeout)))
        last = ""
        for attempt in range(attempts):
            pause = self.retry_wait * 2**attempt
            try:
                resp = client.request(method, self.base_url + path, json=body, headers=self._headers(), timeout=limit)
            except httpx.TransportError as e:
                last = self._failure(e, self.timeout if timeout is None else timeout)
            else:
                if resp.status_code != 429 and resp.status_code < 500:
                    return resp
                last = f"HTTP {resp.status_code}: {_detail(resp)}"
                asked = retry_after(resp.headers.get("Retry-After"))
                pause = pause if asked is None else asked
            if attempt + 1 < attempts:
                if stop is None:
                    time.sleep(pause)
                elif stop.wait(pause):
                    break
        raise _GaveUp(last)

    def _refused(self, resp: httpx.Response, what: str) -> InputError:
        if resp.status_code in (401, 403):
            return InputError(f"endpoint {self.base_url} refused {what} (HTTP {resp.status_code}: {_detail(resp)}); "
                              f"set {self.api_key_env}")
        return InputError(f"endpoint {self.base_url} rejected {what} (HTTP {resp.status_code}: {_detail(resp)})")

    def _names_checkpoint(self, card: dict[str, Any]) -> bool:
        """Whether the card's served name or root is the checkpoint: as the user gave it, the folder it resolved
        to, or (a server on this machine) a path to that same folder."""
        served, root = (v if isinstance(v, str) else None for v in (card.get("id"), card.get("root")))
        if {served, root} & {self.checkpoint, self.checkpoint_dir}:
            return True
        return bool(root) and os.path.exists(root) and os.path.realpath(root) == os.path.realpath(self.checkpoint_dir)

    def check(self) -> None:
        """Ask the endpoint what it serves (bounded retry) and choose the model card: the one `model` names, else
        the first listed. Refuse a card that does not name the checkpoint (unless `trust_served_model`) and a
        `max_model_len` below what the run needs. Once it has passed, later calls do nothing."""
        if self.ran is not None:
            return
        try:
            resp = self._send("GET", "/models", self.connect_attempts, timeout=min(CONNECT_TIMEOUT_S, self.timeout))
        except _GaveUp as e:
            raise InputError(f"endpoint {self.base_url} is unreachable after {self.connect_attempts} attempts ({e}); "
                             "start the server or fix --base-url") from None
        if resp.status_code in (401, 403):
            raise self._refused(resp, "GET /models")
        if resp.status_code != 200:
            raise InputError(f"endpoint {self.base_url} answered GET /models with HTTP {resp.status_code} "
                             f"({_detail(resp)}); --base-url must be the API root, e.g. http://127.0.0.1:8000/v1")
        try:
            cards = resp.json()["data"]
            if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise InputError(f"endpoint {self.base_url} answered GET /models without a model list "
                             f"({_detail(resp)}); is it an OpenAI-compatible server?") from None
        ids = [c.get("id") for c in cards]
        listed = ", ".join(repr(i) for i in ids) if ids else "no model"
        if self.model is None:
            if not cards:
                raise InputError(f"endpoint {self.base_url} serves no model; start the server with {self.checkpoint}")
            card = cards[0]
        else:
            card = next((c for c in cards if c.get("id") == self.model), None)
            if card is None:
                hint = (f"; pass --served-model {ids[0]}" if len(ids) == 1 else
                        "; pass --served-model with one of them" if ids else "")
                raise InputError(f"endpoint {self.base_url} does not serve '{self.model}': it serves {listed}{hint}")
        served, root = card.get("id"), card.get("root")
        if not self.trust_served_model and not self._names_checkpoint(card):
            expected = repr(self.checkpoint) + (f" (at {self.checkpoint_dir})"
                                                if self.checkpoint_dir != self.checkpoint else "")
            raise InputError(f"endpoint {self.base_url} serves '{served}' (root {root!r}), not the checkpoint "
                             f"{expected}; start the server with this checkpoint, or pass --trust-served-model if "
                             "it is the same model under another name")
        have = card.get("max_model_len")
        # Servers other than vLLM do not report their context limit: then it cannot be checked here.
        have = have if isinstance(have, int) and not isinstance(have, bool) else None
        if have is not None and have < self.max_model_len:
            raise InputError(f"endpoint {self.base_url} serves '{served}' with max_model_len {have}, but this run "
                             f"needs {self.max_model_len} tokens (its longest length with the generation budget and "
                             f"special tokens); restart the server with --max-model-len {self.max_model_len} or "
                             "more, or use shorter --lengths")
        self.model = served
        self.server = {"id": served, "root": root, "max_model_len": have}
        self.ran = {"server": dict(self.server)}

    def _complete(self, r: Request, stop: threading.Event) -> tuple[str, int | None]:
        # Greedy as upstream RULER: no stop words (the API's default), the task's generation budget.
        body = {"model": self.model, "prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0.0,
                "top_p": 1.0, "seed": self.seed}
        attempts = self.retries + 1
        try:
            resp = self._send("POST", "/completions", attempts, body, stop=stop)
        except _GaveUp as e:
            raise InputError(f"endpoint {self.base_url} failed {attempts} time{'s' if attempts > 1 else ''} ({e}); "
                             "the predictions made so far are kept: rerun the same command to continue") from None
        if resp.status_code != 200:
            raise self._refused(resp, "a completion request")
        try:
            doc = resp.json()
            text = doc["choices"][0]["text"]
            if not isinstance(text, str):
                raise TypeError
        except (ValueError, KeyError, IndexError, TypeError):
            raise InputError(f"endpoint {self.base_url} answered a completion request without choices[0].text "
                             f"({_detail(resp)})") from None
        usage = doc.get("usage")
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return text, tokens if isinstance(tokens, int) else None

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        """Complete `requests`, `concurrency` at a time, reporting each as it finishes. When one fails for good,
        no new request is sent; those in flight finish and are reported, then the first failure is raised."""
        self.check()
        self._open()
        it = iter(requests)
        stop = threading.Event()
        error: InputError | None = None
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="longctx-openai")
        pending: dict[Future, Request] = {}

        def submit(n: int) -> None:
            for r in islice(it, n):
                pending[pool.submit(self._complete, r, stop)] = r

        try:
            submit(self.concurrency)
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
        if error is not None:
            raise error
