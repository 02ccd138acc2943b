"""The OpenAI-compatible server, driven by the official `openai` client against a server started
here (uvicorn in a thread, on a free loopback port) on the default model cut to 2 layers
(`two_layer_model`: real tokenizer, chat template and shapes; nothing here depends on the
weights): answers equal `fg.generate` with the same options, concurrency, disconnects, refusals."""

import asyncio
import json
import re
import socket
import threading
import time
import urllib.request

import jax
import pytest

import functional_gen as fg

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from functional_gen.serving import app as serving_app  # noqa: E402

MODEL = "smollm2-test"
MAX_SLOTS = 4
MAX_LEN = 128
API_KEY = "test-key"
CHUNK = 32  # prompts longer than this are prefilled in chunks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(two_layer_model):
    """`(base_url, engine)` of a server in this process."""
    model, tokenizer = two_layer_model
    engine = fg.serving.Engine(model, tokenizer, max_slots=MAX_SLOTS, max_len=MAX_LEN,
                               top_logprobs=2, prefill_chunk=CHUNK)  # fmt: skip
    limits = serving_app.Limits(max_n=2, max_body_bytes=20_000)
    app = serving_app.create_app(engine, model_name=MODEL, api_key=API_KEY, limits=limits)
    for base in run_server(app):
        yield base, engine


def run_server(app):
    """Serve `app` with uvicorn in a thread on a free loopback port; yields its base URL once,
    then stops it (a generator for module-scoped fixtures)."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not srv.started:
        assert time.time() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=API_KEY, max_retries=0, timeout=600)


def async_client(base: str):
    """An async client for one `asyncio.run` (its connections belong to that event loop)."""
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=600)


def metrics(base: str) -> dict[str, float]:
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name a colour."}]
STEPS = 10


@pytest.fixture(scope="module")
def greedy_reference(two_layer_model):
    """`fg.generate`'s greedy answers to PROMPT and CHAT (one compiled call), raw logprobs."""
    model, tokenizer = two_layer_model
    return fg.generate(model, tokenizer, [PROMPT, CHAT], max_new_tokens=STEPS,
                       logprobs_mode="raw")  # fmt: skip


def test_completions_equal_generate_greedy_and_seeded(client, two_layer_model, greedy_reference):
    model, tokenizer = two_layer_model
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=STEPS, temperature=0,
                                    logprobs=2)  # fmt: skip
    want = greedy_reference
    assert got.choices[0].text == want.texts[0]
    assert got.usage.prompt_tokens == len(tokenizer(PROMPT)["input_ids"])
    assert got.usage.completion_tokens == STEPS
    assert got.choices[0].finish_reason == "length"
    # the logprob of each token is the model's log_softmax (vLLM's default raw mode), and the
    # greedy token is the most likely of the reported alternatives
    lp = got.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(want.logprobs[0].tolist(), abs=1e-4)
    for top, chosen in zip(lp.top_logprobs, lp.token_logprobs):
        assert max(top.values()) == pytest.approx(chosen, abs=1e-4)

    # sampled with a seed: seed s is generate's key=jax.random.key(s)
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=STEPS,
                                    temperature=0.8, top_p=0.9, seed=7)  # fmt: skip
    want = fg.generate(model, tokenizer, PROMPT, max_new_tokens=STEPS, temperature=0.8,
                       top_p=0.9, key=jax.random.key(7))  # fmt: skip
    assert got.choices[0].text == want.texts[0]
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=STEPS,
                                       temperature=0.8, top_p=0.9, seed=7, stream=True)  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.texts[0]
    assert chunks[-1].usage.completion_tokens == STEPS


def test_chat_equal_generate_streaming_and_not(client, greedy_reference):
    want = greedy_reference.texts[1]
    got = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=STEPS,
                                         temperature=0)  # fmt: skip
    assert got.choices[0].message.content == want
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=STEPS,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    assert chunks[-1].usage.completion_tokens == got.usage.completion_tokens


def test_concurrent_requests_each_equal_alone(server, client):
    """24 requests with different parameters, lengths and stop strings at once (more than the
    slots): every one completes and equals the same request sent alone."""
    prompts = ["Once upon a time", "The capital of France is", "List three fruits:", "def f(x):"]
    kinds = [
        dict(temperature=0),
        dict(temperature=0.9, top_p=0.8, seed=3),
        dict(temperature=0.7, seed=11, presence_penalty=0.5, frequency_penalty=0.3),
        dict(temperature=0, stop=[","]),
        dict(temperature=1.0, seed=5, logit_bias={"13": -100}),
        dict(temperature=0.5, seed=1, stop=["\n"]),
    ]
    requests = [dict(prompt=p, max_tokens=4 + (i % 5) * 3, **kinds[i % len(kinds)])
                for i, p in enumerate(prompts * 6)]  # fmt: skip

    async def everything():
        async with async_client(server[0]) as aclient:

            async def one(r):
                out = await aclient.completions.create(model=MODEL, **r)
                return out.choices[0].text, out.choices[0].finish_reason

            return await asyncio.gather(*(one(r) for r in requests))

    together = asyncio.run(everything())
    for r, got in zip(requests, together):
        alone = client.completions.create(model=MODEL, **r)
        assert got == (alone.choices[0].text, alone.choices[0].finish_reason), r
        if "stop" in r:
            assert not any(s in got[0] for s in r["stop"])


# the longest text the schema below allows (whitespace between JSON tokens: none or one space)
LONGEST_PERSON = '{ "name" : "Ann" , "age" : 99 }'


def test_constrained_requests_validate_and_equal_alone(server, client):
    """A JSON Schema, a regex and a choice, sent together with a free request: each constrained
    request has room for the longest text its constraint allows (plus the EOS) and stops, its
    output validates, and each equals the same request sent alone."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {"name": {"enum": ["Ann", "Bob"]},
                       "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }  # fmt: skip
    ask = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    requests = [
        dict(messages=ask("A person as JSON."), max_tokens=len(LONGEST_PERSON) + 1, temperature=0,
             response_format={"type": "json_schema", "json_schema": {"name": "p",
                                                                     "schema": schema}}),
        dict(messages=ask("A date?"), max_tokens=len("2026-11-28") + 1, temperature=0,
             extra_body={"guided_regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}),
        dict(messages=ask("Is the sky blue?"), max_tokens=len("yes") + 1, temperature=0.7, seed=1,
             extra_body={"guided_choice": ["yes", "no"]}),
        dict(messages=ask("Hello!"), max_tokens=6, temperature=0),
    ]  # fmt: skip

    async def everything():
        async with async_client(server[0]) as aclient:

            async def one(r):
                out = await aclient.chat.completions.create(model=MODEL, **r)
                return out.choices[0].message.content, out.choices[0].finish_reason

            return await asyncio.gather(*(one(r) for r in requests))

    together = asyncio.run(everything())
    assert [reason for _, reason in together[:3]] == ["stop"] * 3, together
    person, date, answer = (text for text, _ in together[:3])
    jsonschema.validate(json.loads(LONGEST_PERSON), schema)  # the bound's own text
    jsonschema.validate(json.loads(person), schema)
    assert re.fullmatch("[0-9]{4}-[0-9]{2}-[0-9]{2}", date)
    assert answer in ("yes", "no")
    for r, got in zip(requests, together):
        alone = client.chat.completions.create(model=MODEL, **r)
        assert got == (alone.choices[0].message.content, alone.choices[0].finish_reason)


def test_disconnects_free_every_slot(server, client):
    base, _ = server

    async def twenty():
        async with async_client(base) as aclient:

            async def leave_early():
                stream = await aclient.completions.create(
                    model=MODEL, prompt="Tell me a story", max_tokens=100, temperature=0,
                    stream=True,
                )  # fmt: skip
                async for _ in stream:
                    break
                await stream.close()

            await asyncio.gather(*(leave_early() for _ in range(20)))

    asyncio.run(twenty())
    deadline = time.time() + 30
    while True:
        m = metrics(base)
        if m["functional_gen_busy_slots"] == 0 and m["functional_gen_queue_length"] == 0:
            break
        assert time.time() < deadline, m
        time.sleep(0.2)
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0)
    assert out.usage.completion_tokens == 3
    assert m["functional_gen_time_to_first_token_seconds_count"] >= 1


def test_full_queue_refuses_with_429_and_accepted_requests_complete(server, client, monkeypatch):
    """With room for one waiting request (`Orchestrator.max_queue = 1`; 4 slots), 12 requests
    sent at once: at most the slots, one prefilling and one waiting can be taken before a slot
    frees (24 decode steps), so some are refused with 429 in OpenAI's error shape
    (`rate_limit_error`, `queue_full`) and counted by /metrics; every accepted one completes
    and equals the same request sent alone, and the queue takes requests again afterwards."""
    base, engine = server
    monkeypatch.setattr(engine.orchestrator, "max_queue", 1)
    refusals = 'functional_gen_requests_total{endpoint="/v1/completions",status="429"}'
    before = metrics(base).get(refusals, 0.0)
    request = dict(prompt="Count to thirty: one, two, three,", max_tokens=24, temperature=0)

    async def twelve():
        async with async_client(base) as aclient:

            async def one():
                try:
                    out = await aclient.completions.create(model=MODEL, **request)
                except openai.RateLimitError as error:
                    return error
                return out.choices[0].text, out.choices[0].finish_reason

            return await asyncio.gather(*(one() for _ in range(12)))

    outcomes = asyncio.run(twelve())
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    answered = [o for o in outcomes if not isinstance(o, openai.RateLimitError)]
    assert refused and answered, outcomes
    for error in refused:
        assert error.status_code == 429
        body = error.response.json()
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "rate_limit_error"
        assert body["error"]["code"] == "queue_full"
        assert "1 requests are already waiting" in body["error"]["message"]
    assert metrics(base)[refusals] - before == len(refused)
    monkeypatch.undo()  # the default queue again
    alone = client.completions.create(model=MODEL, **request).choices[0]
    assert answered == [(alone.text, alone.finish_reason)] * len(answered)


def post(base: str, path: str, body, key: str | None = API_KEY):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        ({"prompt": "hi", "max_tokens": 2, "frobnicate": 1}, 400, "frobnicate"),
        ({"prompt": "hi " * 200, "max_tokens": 2}, 400, "max_len"),
        ({"prompt": "hi", "max_tokens": 500}, 400, "max_tokens=500"),
        ({"prompt": "hi", "max_tokens": 2, "n": 3}, 400, "n=3"),
        ({"prompt": "hi", "max_tokens": 2, "temperature": -1}, 400, "temperature"),
        ({"prompt": "hi", "max_tokens": 2, "model": "gpt-4"}, 404, "gpt-4"),
        ({"prompt": "hi", "max_tokens": 2, "logprobs": 9}, 400, "logprobs=9"),
        ({"prompt": "x" * 30_000}, 400, "limit"),
        ({"prompt": "hi", "guided_regex": "(unclosed"}, 400, "guided_regex"),
        (
            {
                "prompt": "hi",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strnig"}},
                },
            },
            400,
            "response_format",
        ),
        ({"prompt": "hi", "guided_regex": "a", "guided_choice": ["b"]}, 400, "at most one"),
    ],
)
def test_refusals(server, body, status, words):
    base, _ = server
    code, answer = post(base, "/v1/completions", body)
    assert code == status
    assert words in answer["error"]["message"]
    assert set(answer["error"]) == {"message", "type", "param", "code"}


def test_api_key_and_endpoints(server, client):
    base, engine = server
    code, answer = post(base, "/v1/completions", {"prompt": "hi"}, key="wrong")
    assert code == 401 and "API key" in answer["error"]["message"]
    code, _ = post(base, "/v1/completions", {"prompt": "hi"}, key=None)
    assert code == 401
    bad = openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert [m.id for m in client.models.list()] == [MODEL]
    health = json.loads(urllib.request.urlopen(base + "/health").read())
    assert health == {"status": "ok"}
    m = metrics(base)
    assert m["functional_gen_max_slots"] == MAX_SLOTS
    assert m["functional_gen_cache_compactions_total"] == engine.compactions
    assert m["functional_gen_generated_tokens_total"] > 0


def run_alone_or_among(engine, request, slot, neighbours=()):
    """The tokens `request` gets in `slot` of a fresh decode state, `neighbours` (`(slot,
    request)` pairs) inserted first."""
    state = engine.init_decode_state()
    for s, r in neighbours:
        state = engine.insert(engine.prefill(r), state, s)
    state = engine.insert(engine.prefill(request), state, slot)
    tokens = []
    while True:
        state, out = engine.generate(state)
        column = out.token_ids[:, slot].tolist()
        tokens += [t for t in column if t >= 0]
        if bool(out.done[slot]):
            return tokens


def test_engine_rows_do_not_depend_on_slot_or_neighbours(server, two_layer_model):
    """The engine's three functions, directly: a request's tokens are the same alone in slot 0
    and in slot 3 among other requests (greedy and seeded sampling), and a prompt prefilled in
    chunks continues as one prefilled at once."""
    _, engine = server
    _, tokenizer = two_layer_model
    ids = tokenizer("Once upon a time, in a land far away,")["input_ids"]
    others = [(0, engine.request(tokenizer("Hello")["input_ids"], 12, temperature=0)),
              (1, engine.request(ids, 5, temperature=1.0, seed=2))]  # fmt: skip
    for knobs in (dict(temperature=0), dict(temperature=0.9, top_p=0.95, seed=3)):
        request = engine.request(ids, 8, **knobs)
        alone = run_alone_or_among(engine, request, 0)
        assert len(alone) == 8
        assert run_alone_or_among(engine, request, 3, others) == alone

    long_ids = tokenizer(" ".join(["river"] * 45))["input_ids"]
    assert len(long_ids) > CHUNK
    once = fg.serving.Engine(engine.model, tokenizer, max_slots=MAX_SLOTS, max_len=MAX_LEN)
    chunked = engine.prefill(engine.request(long_ids, 4))
    whole = once.prefill(once.request(long_ids, 4))
    assert chunked.cache.max_len == 2 * CHUNK and whole.cache.max_len == 48
    assert jax.numpy.allclose(chunked.logits, whole.logits, atol=1e-3)
    request = engine.request(long_ids, 6, temperature=0)
    assert run_alone_or_among(engine, request, 2) == run_alone_or_among(once, request, 2)
