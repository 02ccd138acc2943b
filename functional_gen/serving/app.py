"""The OpenAI-compatible HTTP server: FastAPI + uvicorn in front of an `Engine`'s orchestrator.

    POST /v1/completions        POST /v1/chat/completions   (both: "stream": true -> SSE)
    GET  /v1/models             GET  /health                GET  /metrics (Prometheus text)

Every refusal is OpenAI's error JSON, `{"error": {"message", "type", "param", "code"}}`: 400 for
a malformed body, an unknown field (named), a value out of range, a prompt too long for
`max_len`, `max_tokens` / `n` / the body over the limits; 401 for a missing or wrong API key
(`Authorization: Bearer KEY`, compared with `hmac.compare_digest`); 404 for another model's
name. Nothing in a request names a file: the model is fixed when the server starts.

Seeds: choice `i` of a request with `seed=s` samples with `fold_in(jax.random.key(s + i), 0)`,
the key that `fg.generate(..., key=jax.random.key(s + i))` gives its one row. Without a seed the
key is random. A request without `temperature` decodes as the model's generation config says
(greedy for SmolLM2); `temperature: 0` is greedy.

This module imports FastAPI, uvicorn and prometheus-client (the `serve` extra); `import
functional_gen` does not import it.
"""

import asyncio
import dataclasses
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import prometheus_client
import uvicorn
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import ValidationError

from ..structured import Choice, Grammar, JsonSchema, Regex
from ..tokenization import encode_prompt
from .engine import Engine
from .orchestrator import Error, Finished, Handle, Piece, QueueFull
from .protocol import ChatCompletionRequest, CompletionRequest

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Histogram buckets of the time to first token, in seconds."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask: `max_body_bytes` (the JSON body), `max_tokens` (per choice;
    `None`: what `max_len` leaves after the prompt), `max_n` (choices), `max_stop` (stop
    strings), `drain_seconds` (after SIGTERM, how long streams may go on before they end with
    an error event)."""

    max_body_bytes: int = 1 << 20
    max_tokens: int | None = None
    max_n: int = 8
    max_stop: int = 4
    drain_seconds: float = 5.0


class APIError(Exception):
    """A refusal in OpenAI's error shape (`status`, `message`, `param`, `type`, `code`)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status,
            message,
            param,
            code,
            type,
        )

    def response(self) -> JSONResponse:
        """The JSON response."""
        body = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


class _Collector:
    """Prometheus metrics read from the orchestrator at scrape time."""

    def __init__(self, engine: Engine, started: float):
        self.engine, self.started = engine, started
        self._last = (time.monotonic(), 0)
        self.rate = 0.0

    def collect(self):
        o = self.engine.orchestrator
        now, tokens = time.monotonic(), o.generated_tokens
        last_time, last_tokens = self._last
        if now - last_time > 0.5:
            self.rate = (tokens - last_tokens) / (now - last_time)
            self._last = (now, tokens)
        yield GaugeMetricFamily(
            "functional_gen_queue_length", "Requests waiting for a slot", value=o.queue_length
        )
        yield GaugeMetricFamily(
            "functional_gen_busy_slots", "Slots holding a request", value=o.busy_slots
        )
        yield GaugeMetricFamily(
            "functional_gen_max_slots", "Slots of the engine", value=self.engine.max_slots
        )
        yield CounterMetricFamily(
            "functional_gen_generated_tokens", "Tokens generated", value=tokens
        )
        yield CounterMetricFamily(
            "functional_gen_cache_compactions",
            "Times the engine shifted its lockstep cache left (Engine.compact)",
            value=self.engine.compactions,
        )
        yield GaugeMetricFamily(
            "functional_gen_tokens_per_second",
            "Generated tokens per second since the previous scrape",
            value=self.rate,
        )
        if self.engine.speculation is not None:  # Engine(speculative=...)
            yield CounterMetricFamily(
                "functional_gen_speculative_verified_tokens",
                "Speculative guesses the model verified",
                value=o.verified_tokens,
            )
            yield CounterMetricFamily(
                "functional_gen_speculative_accepted_tokens",
                "Speculative guesses the model accepted",
                value=o.accepted_tokens,
            )
        paged = self.engine.paged
        if paged is not None:  # Engine(block_size=...): the paged KV cache's blocks
            yield GaugeMetricFamily(
                "functional_gen_kv_blocks_in_use",
                "KV cache blocks referenced by running requests",
                value=paged.allocator.blocks_in_use,
            )
            yield GaugeMetricFamily(
                "functional_gen_kv_blocks",
                "KV cache blocks in the pool",
                value=paged.allocator.num_blocks,
            )
            yield CounterMetricFamily(
                "functional_gen_prefix_cache_hits",
                "Prompt blocks taken from the prefix cache instead of prefilled",
                value=paged.allocator.prefix_cache_hits,
            )
            yield CounterMetricFamily(
                "functional_gen_preemptions",
                "Requests preempted to free KV cache blocks (recomputed when readmitted)",
                value=paged.preemptions,
            )


def create_app(
    engine: Engine, *, model_name: str, api_key: str | None = None, limits: Limits = Limits()
) -> FastAPI:
    """The FastAPI application serving `engine` under `model_name`.

    **Arguments:** `engine` (its orchestrator starts with the app and stops with it);
    `model_name` (what `/v1/models` lists and requests must name, if they name one);
    `api_key` (`None`: no key needed); `limits` (a `Limits`).
    """
    registry = prometheus_client.CollectorRegistry()
    registry.register(_Collector(engine, time.time()))
    ttft = prometheus_client.Histogram(
        "functional_gen_time_to_first_token_seconds",
        "Seconds from a request's arrival to its first generated token",
        buckets=TTFT_BUCKETS,
        registry=registry,
    )
    requests_total = prometheus_client.Counter(
        "functional_gen_requests",
        "Requests answered, by endpoint and status",
        ["endpoint", "status"],
        registry=registry,
    )
    created = int(time.time())
    state = {"draining_since": None}

    async def lifespan(app):
        engine.orchestrator.on_first_token = ttft.observe
        yield
        engine.close()

    app = FastAPI(title="functional_gen", lifespan=lifespan)
    app.state.serving = state

    @app.exception_handler(APIError)
    async def _api_error(request, error: APIError):
        requests_total.labels(request.url.path, str(error.status)).inc()
        return error.response()

    def check_key(request: HTTPRequest) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), api_key.encode()
        )
        if not ok:
            raise APIError(
                401,
                "missing or incorrect API key (send Authorization: Bearer KEY)",
                code="invalid_api_key",
            )

    async def parse(request: HTTPRequest, model_type):
        check_key(request)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise APIError(
                400,
                f"the request body has {declared} bytes, more than the limit of "
                f"{limits.max_body_bytes}",
                code="body_too_large",
            )
        body = await request.body()
        if len(body) > limits.max_body_bytes:
            raise APIError(
                400,
                f"the request body has {len(body)} bytes, more than the limit "
                f"of {limits.max_body_bytes}",
                code="body_too_large",
            )
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            parsed = model_type.model_validate(data)
        except ValidationError as e:
            raise _validation_error(e) from None
        if parsed.model is not None and parsed.model != model_name:
            raise APIError(
                404,
                f"the model {parsed.model!r} does not exist; this server serves {model_name!r}",
                param="model",
                code="model_not_found",
            )
        return parsed

    @app.get("/health")
    async def health():
        o = engine.orchestrator
        if state["draining_since"] is not None or o.error is not None:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(
            prometheus_client.generate_latest(registry),
            media_type=prometheus_client.CONTENT_TYPE_LATEST,
        )

    @app.get("/v1/models")
    async def models(request: HTTPRequest):
        check_key(request)
        card = {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "functional_gen",
            "max_model_len": engine.max_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        body = await parse(request, CompletionRequest)
        ids = _completion_prompt(engine, body)
        return await respond(body, ids, chat=False, k=body.logprobs)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        body = await parse(request, ChatCompletionRequest)
        messages = []
        for i, m in enumerate(body.messages):
            content = m.content
            if not isinstance(content, str):
                parts = []
                for part in content:
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        raise APIError(
                            400,
                            f"messages[{i}].content: only text parts are supported",
                            param=f"messages[{i}].content",
                        )
                    parts.append(part["text"])
                content = "".join(parts)
            role = "system" if m.role == "developer" else m.role
            messages.append({"role": role, "content": content})
        try:
            ids = encode_prompt(engine.tokenizer, messages)
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        k = (body.top_logprobs or 0) if body.logprobs else None
        return await respond(body, ids, chat=True, k=k)

    async def respond(body, ids: list[int], *, chat: bool, k: int | None):
        requests, stops = _requests(engine, body, ids, limits, chat=chat, k=k)
        # automaton tables are built here, in a worker thread: not on the event loop, nor on
        # the device thread
        constraint, entry = await asyncio.to_thread(_locked_constraint, engine, body)
        o = engine.orchestrator
        try:
            handles = [o.submit(r, stops, constraint=constraint, entry=entry) for r in requests]
        except QueueFull as e:
            raise APIError(429, str(e), code="queue_full", type="rate_limit_error") from None
        except RuntimeError as e:
            raise APIError(503, str(e), code="unavailable", type="server_error") from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        requests_total.labels(endpoint, "200").inc()
        if body.stream:
            return StreamingResponse(
                _sse(
                    engine,
                    body,
                    rid,
                    handles,
                    len(ids),
                    chat,
                    k,
                    model_name,
                    created,
                    state,
                    limits,
                ),
                media_type="text/event-stream",
            )
        try:
            results = await asyncio.gather(*(_collect(h) for h in handles))
        finally:
            for h in handles:
                h.cancel()
        choices, completion_tokens = [], 0
        for i, (pieces, final) in enumerate(results):
            if isinstance(final, Error):
                raise APIError(503, final.message, code="unavailable", type="server_error")
            completion_tokens += final.completion_tokens
            text = "".join(p.text for p in pieces)
            lp = _logprobs(engine, pieces, chat, k) if k is not None else None
            if chat:
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": final.finish_reason,
                        "logprobs": lp,
                    }
                )
            else:
                choices.append(
                    {"index": i, "text": text, "finish_reason": final.finish_reason, "logprobs": lp}
                )
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(ids) + completion_tokens,
        }
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": usage,
        }

    return app


def _validation_error(e: ValidationError) -> APIError:
    """One 400 naming every unknown field, or the first bad value."""
    errors = e.errors()
    unknown = [
        ".".join(str(x) for x in err["loc"]) for err in errors if err["type"] == "extra_forbidden"
    ]
    if unknown:
        return APIError(
            400, f"unknown field(s): {', '.join(unknown)}", param=unknown[0], code="unknown_field"
        )
    first = errors[0]
    where = ".".join(str(x) for x in first["loc"]) or "body"
    given = f" (got {first['input']!r})" if "input" in first and first["loc"] else ""
    return APIError(400, f"{where}: {first['msg']}{given}", param=where)


def _completion_prompt(engine: Engine, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if body.echo or body.suffix is not None or body.best_of not in (None, 1):
        names = [
            n
            for n, bad in (
                ("echo", body.echo),
                ("suffix", body.suffix is not None),
                ("best_of", body.best_of not in (None, 1)),
            )
            if bad
        ]
        raise APIError(400, f"not supported by this server: {', '.join(names)}", param=names[0])
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise APIError(
                400, f"`prompt` holds {len(prompt)} prompts; send one per request", param="prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "`prompt` is empty", param="prompt")
        return encode_prompt(engine.tokenizer, prompt, chat_template=False)
    if not prompt:
        raise APIError(400, "`prompt` is empty", param="prompt")
    vocab = engine.model.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise APIError(
            400,
            f"`prompt` token ids {bad[:5]} are outside the vocabulary [0, {vocab})",
            param="prompt",
        )
    return list(prompt)


_CONSTRAINT_LOCK = threading.Lock()


def _locked_constraint(engine: Engine, body):
    """`_constraint`, one at a time: the structured package imports its third-party builders
    (outlines-core, lark, llguidance, scipy) on first use, and two threads importing one
    extension module at once can fail (seen: `No module named 'outlines_core.json_schema'`).

    **Returns:** `(constraint, entry)`: the processor (or `None`) and its tables padded for the
    engine's constraint pool (`Engine.constraint_entry`; `None` when it does not fit)."""
    with _CONSTRAINT_LOCK:
        constraint = _constraint(engine, body)
    entry = None if constraint is None else engine.constraint_entry(constraint)
    return constraint, entry


def _constraint(engine: Engine, body):
    """The structured-generation processor a body asks for (`response_format` `json_object` /
    `json_schema`, `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (GBNF
    text)), or `None`.

    **Raises:** `APIError` (400) for more than one, or naming what the constraint refuses (a bad
    regex, an invalid or too large schema, a grammar error).
    """
    given = {}
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        given["response_format"] = ("json", {"type": "object"})
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise APIError(
                400, "response_format json_schema needs json_schema.schema", param="response_format"
            )
        given["response_format"] = ("json", fmt.json_schema.schema_)
    if body.guided_json is not None:
        schema = body.guided_json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise APIError(
                    400, f"guided_json is not valid JSON: {e}", param="guided_json"
                ) from None
        given["guided_json"] = ("json", schema)
    for name, kind in (
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ):
        if getattr(body, name) is not None:
            given[name] = (kind, getattr(body, name))
    if not given:
        return None
    if len(given) > 1:
        raise APIError(
            400, f"give at most one constraint, got {', '.join(given)}", param=list(given)[1]
        )
    ((name, (kind, value)),) = given.items()
    tokenizer, eos = engine.tokenizer, list(engine.eos_token_id)
    vocab = engine.model.vocab_size
    try:
        if kind == "json":
            return JsonSchema(value, tokenizer, eos_token_id=eos, vocab_size=vocab)
        if kind == "regex":
            return Regex(value, tokenizer, eos_token_id=eos, vocab_size=vocab)
        if kind == "choice":
            if not value or not all(isinstance(v, str) and v for v in value):
                raise ValueError("guided_choice must be a list of non-empty strings")
            return Choice(value, tokenizer, eos_token_id=eos, vocab_size=vocab)
        return Grammar.from_gbnf(value, tokenizer, eos_token_id=eos, vocab_size=vocab)
    except (ValueError, TypeError) as e:
        raise APIError(400, f"{name}: {e}", param=name, code="invalid_constraint") from None


def _default_temperature(engine: Engine) -> float:
    """The model's generation config's choice: its temperature when it samples, else greedy."""
    config = engine.model.generation_config
    if config is not None and getattr(config, "do_sample", False):
        t = getattr(config, "temperature", None)
        return 1.0 if t is None else float(t)
    return 0.0


def _requests(engine, body, ids, limits: Limits, *, chat: bool, k: int | None):
    """The engine requests (one per choice) and the stop strings of a parsed body."""
    if body.n > limits.max_n:
        raise APIError(400, f"n={body.n} is more than the limit of {limits.max_n}", param="n")
    if k is not None and k > engine.top_logprobs:
        name = "top_logprobs" if chat else "logprobs"
        raise APIError(
            400, f"{name}={k} is more than this server reports ({engine.top_logprobs})", param=name
        )
    stops = body.stop
    stops = [] if stops is None else ([stops] if isinstance(stops, str) else list(stops))
    if len(stops) > limits.max_stop or any(not s for s in stops):
        raise APIError(
            400,
            f"`stop` takes at most {limits.max_stop} non-empty strings, got {stops!r}",
            param="stop",
        )
    width = engine.prefill_width(len(ids))
    room = engine.max_len - width
    if room < 1:
        raise APIError(
            400,
            f"the prompt has {len(ids)} tokens; this server's max_len is "
            f"{engine.max_len} (prompt padded to {width}, plus max_tokens)",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    if chat:
        max_tokens = body.max_completion_tokens or body.max_tokens
        name = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    else:
        max_tokens, name = body.max_tokens, "max_tokens"
    limit = room if limits.max_tokens is None else min(room, limits.max_tokens)
    if max_tokens is None:
        max_tokens = limit
    if max_tokens > limit:
        raise APIError(
            400,
            f"{name}={max_tokens} is more than the {limit} tokens this request "
            f"may generate (max_len {engine.max_len}, prompt {len(ids)} tokens padded "
            f"to {width})",
            param=name,
            code="context_length_exceeded",
        )
    temperature = body.temperature if body.temperature is not None else _default_temperature(engine)
    bias = []
    for key, value in (body.logit_bias or {}).items():
        try:
            bias.append((int(key), float(value)))
        except ValueError:
            raise APIError(
                400, f"logit_bias key {key!r} is not a token id", param="logit_bias"
            ) from None
    knobs = {
        "temperature": float(temperature),
        "top_p": 1.0 if body.top_p is None else float(body.top_p),
        "min_p": 0.0 if body.min_p is None else float(body.min_p),
        "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
        "presence_penalty": body.presence_penalty or 0.0,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "logit_bias": tuple(bias),
        "top_k": body.top_k or 0,
        "stop_token_ids": tuple(body.stop_token_ids or ()),
    }
    out = []
    for i in range(body.n):
        seed = None if body.seed is None else body.seed + i
        try:
            out.append(engine.request(ids, max_tokens, seed=seed, **knobs))
        except ValueError as e:
            raise APIError(400, str(e)) from None
    return out, tuple(stops)


async def _collect(handle: Handle):
    pieces = []
    async for event in handle.events():
        if isinstance(event, Piece):
            pieces.append(event)
        else:
            return pieces, event


def _token_text(engine: Engine, token: int) -> str:
    return engine.tokenizer.decode([token])


def _logprobs(engine: Engine, pieces: list[Piece], chat: bool, k: int) -> dict:
    ids = [t for p in pieces for t in p.token_ids]
    lps = [lp for p in pieces for lp in p.logprobs]
    tops = [top[:k] for p in pieces for top in p.top_logprobs]
    if chat:
        content = []
        for t, lp, top in zip(ids, lps, tops):
            text = _token_text(engine, t)
            content.append(
                {
                    "token": text,
                    "logprob": lp,
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {
                            "token": _token_text(engine, a),
                            "logprob": b,
                            "bytes": list(_token_text(engine, a).encode()),
                        }
                        for a, b in top
                    ],
                }
            )
        return {"content": content}
    offsets, pos = [], 0
    texts = [_token_text(engine, t) for t in ids]
    for text in texts:
        offsets.append(pos)
        pos += len(text)
    return {
        "tokens": texts,
        "token_logprobs": lps,
        "top_logprobs": [{_token_text(engine, a): b for a, b in top} for top in tops],
        "text_offset": offsets,
    }


async def _sse(
    engine, body, rid, handles, prompt_tokens, chat, k, model_name, created, state, limits: Limits
) -> AsyncIterator[str]:
    """The server-sent events of a streamed request, `data: [DONE]` last; an error event (and
    `[DONE]`) if the engine stops or the server drains past `limits.drain_seconds`."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(i, handle):
        async for event in handle.events():
            await merged.put((i, event))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]

    def chunk(choices, usage=None) -> str:
        data = {
            "id": rid,
            "object": obj,
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
        }
        if usage is not None:
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n"

    try:
        if chat:
            yield chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                        "logprobs": None,
                    }
                    for i in range(len(handles))
                ]
            )
        open_choices, completion_tokens = len(handles), 0
        while open_choices:
            try:
                i, event = await asyncio.wait_for(merged.get(), 0.25)
            except TimeoutError:
                since = state["draining_since"]
                if since is not None and time.monotonic() - since > limits.drain_seconds:
                    event = Error("the server is shutting down")
                    i = None
                else:
                    continue
            if isinstance(event, Error):
                error = {
                    "message": event.message,
                    "type": "server_error",
                    "param": None,
                    "code": "unavailable",
                }
                yield f"data: {json.dumps({'error': error})}\n\n"
                break
            if isinstance(event, Piece):
                lp = _logprobs(engine, [event], chat, k) if k is not None else None
                if chat:
                    choice = {
                        "index": i,
                        "delta": {"content": event.text},
                        "finish_reason": None,
                        "logprobs": lp,
                    }
                else:
                    choice = {"index": i, "text": event.text, "finish_reason": None, "logprobs": lp}
                yield chunk([choice])
                continue
            assert isinstance(event, Finished)
            open_choices -= 1
            completion_tokens += event.completion_tokens
            done = open_choices == 0
            usage = (
                {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
                if done
                else None
            )
            if chat:
                choice = {
                    "index": i,
                    "delta": {},
                    "finish_reason": event.finish_reason,
                    "logprobs": None,
                }
            else:
                choice = {
                    "index": i,
                    "text": "",
                    "finish_reason": event.finish_reason,
                    "logprobs": None,
                }
            yield chunk([choice], usage)
            include = body.stream_options is not None and body.stream_options.include_usage
            if done and include:
                yield chunk([], usage)
        yield "data: [DONE]\n\n"
    finally:
        for h in handles:
            h.cancel()
        for t in tasks:
            t.cancel()


class _Server(uvicorn.Server):
    """uvicorn's server that tells the app when SIGTERM / SIGINT arrive (streams then have
    `Limits.drain_seconds` to finish before they end with an error event)."""

    def __init__(self, config, state: dict[str, Any]):
        super().__init__(config)
        self._serving_state = state

    def handle_exit(self, sig, frame) -> None:
        if self._serving_state["draining_since"] is None:
            self._serving_state["draining_since"] = time.monotonic()
        super().handle_exit(sig, frame)


def serve(
    engine: Engine,
    *,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: Limits = Limits(),
    log_level: str = "info",
) -> None:
    """Run the server until SIGTERM / SIGINT (blocking): open streams get
    `limits.drain_seconds` to finish, then the engine stops.

    **Arguments:** as `create_app`, plus `host` (default loopback only), `port`, `log_level`
    (uvicorn's).
    """
    app = create_app(engine, model_name=model_name, api_key=api_key, limits=limits)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=int(limits.drain_seconds) + 2,
    )
    _Server(config, app.state.serving).run()


__all__ = ["APIError", "Limits", "create_app", "serve"]
