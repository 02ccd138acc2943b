"""Constrained requests decode in their slots (the engine's constraint table pool) beside the
others, equal to the same request alone and to `fg.generate` with that constraint; a new schema
compiles nothing; per-request `stop_token_ids` and `top_k` (vLLM's extras) are honoured. On the
default model cut to 2 layers (`two_layer_model`: nothing here depends on the weights)."""

import asyncio
import contextlib
import json
import logging
import re

import jax
import pytest

import functional_gen as fg
from tests.errors.compilations import count_compilations

from .test_server import openai, run_server, serving_app

jsonschema = pytest.importorskip("jsonschema")

MODEL = "smollm2-pool-test"
MAX_SLOTS = 8
MAX_LEN = 128
PROMPT = "The capital of France is"

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]{0,11}$"},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}  # fmt: skip
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "big": {"type": "boolean"}},
    "required": ["city", "big"],
    "additionalProperties": False,
}  # fmt: skip
DATE = "[0-9]{4}-[0-9]{2}-[0-9]{2}"
# The longest texts these constraints allow (whitespace between JSON tokens: none or one space;
# ASCII, so every token is at least one character): one token more than its characters (the EOS)
# is enough for a request to stop, so every constrained request below must end with "stop".
LONGEST = {
    "PERSON": '{ "name" : "Abcdefghijkl" , "age" : 120 }',
    "CITY": '{ "city" : "Paris" , "big" : false }',
    "DATE": "2026-11-28",
}


@pytest.fixture(scope="module")
def server(two_layer_model):
    """`(base_url, engine, alone_calls)`: a server in this process; `alone_calls` counts the
    requests that ran alone (`Engine.generate_alone`) instead of in a slot."""
    model, tokenizer = two_layer_model
    # width 1 besides 8 (not the default 1, 2, 4): a constrained row left alone runs a narrow
    # dispatch (the pool gathered with them) at the cost of one more compiled program, not three
    engine = fg.serving.Engine(
        model, tokenizer, max_slots=MAX_SLOTS, max_len=MAX_LEN, decode_widths=(1,)
    )
    alone_calls = []
    run_alone = engine.generate_alone

    def counting(request, constraint):
        alone_calls.append(constraint)
        return run_alone(request, constraint)

    engine.generate_alone = counting
    app = serving_app.create_app(engine, model_name=MODEL)
    for base in run_server(app):
        yield base, engine, alone_calls


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="-", max_retries=0, timeout=600)


def ask(text):
    return [{"role": "user", "content": text}]


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def test_constrained_slots_validate_and_equal_alone(server, client):
    """24 concurrent requests (more than the slots) mixing two JSON Schemas, a regex, a choice
    and free requests, greedy and seeded: every constrained request has room to finish its
    text and does ("stop"), every constrained output validates (jsonschema, `re.fullmatch`),
    every output equals the same request sent alone, and none ran outside the slots."""
    _, _, alone_calls = server
    jsonschema.validate(json.loads(LONGEST["PERSON"]), PERSON)  # the bounds' own texts
    jsonschema.validate(json.loads(LONGEST["CITY"]), CITY)
    assert re.fullmatch(DATE, LONGEST["DATE"])
    kinds = [
        dict(messages=ask("A person as JSON."), max_tokens=len(LONGEST["PERSON"]) + 1,
             response_format=schema_format(PERSON)),
        dict(messages=ask("A city as JSON."), max_tokens=len(LONGEST["CITY"]) + 1,
             response_format=schema_format(CITY)),
        dict(messages=ask("A date?"), max_tokens=len(LONGEST["DATE"]) + 1,
             extra_body={"guided_regex": DATE}),
        dict(messages=ask("Is the sky blue?"), max_tokens=len("maybe") + 1,
             extra_body={"guided_choice": ["yes", "no", "maybe"]}),
        dict(messages=ask("Name a colour."), max_tokens=8),
        dict(messages=ask("Count to five."), max_tokens=10, temperature=0.9, seed=4,
             extra_body={"top_k": 20}),
    ]  # fmt: skip
    requests = []
    for i in range(24):
        r = dict(kinds[i % len(kinds)])
        if i >= len(kinds) and i % 2:  # the same constraints, sampled with a seed
            r.update(temperature=0.8, seed=i)
        r.setdefault("temperature", 0)
        requests.append(r)

    async def everything():
        async with openai.AsyncOpenAI(base_url=server[0] + "/v1", api_key="-", max_retries=0,
                                      timeout=600) as aclient:  # fmt: skip

            async def one(r):
                out = await aclient.chat.completions.create(model=MODEL, **r)
                return out.choices[0].message.content, out.choices[0].finish_reason

            return await asyncio.gather(*(one(r) for r in requests))

    together = asyncio.run(everything())
    for r, (text, reason) in zip(requests, together):
        alone = client.chat.completions.create(model=MODEL, **r).choices[0]
        assert (text, reason) == (alone.message.content, alone.finish_reason), r
        fmt = r.get("response_format")
        extra = r.get("extra_body", {})
        if fmt is not None:
            assert reason == "stop", (r, text)
            jsonschema.validate(json.loads(text), fmt["json_schema"]["schema"])
        if "guided_regex" in extra:
            assert reason == "stop", (r, text)
            assert re.fullmatch(DATE, text), text
        if "guided_choice" in extra:
            assert reason == "stop", (r, text)
            assert text in extra["guided_choice"], text
    assert alone_calls == [], "a pooled constraint ran alone"


def test_pooled_constraint_equals_generate(server, client, two_layer_model):
    """A constrained slot computes what `fg.generate` with that constraint computes (greedy)."""
    model, tokenizer = two_layer_model
    _, engine, _ = server
    eos, vocab = list(engine.eos_token_id), model.vocab_size
    cases = [
        (dict(response_format=schema_format(PERSON)), 24,
         fg.processors.JsonSchema(PERSON, tokenizer, eos_token_id=eos, vocab_size=vocab)),
        (dict(extra_body={"guided_regex": DATE}), 12,
         fg.processors.Regex(DATE, tokenizer, eos_token_id=eos, vocab_size=vocab)),
    ]  # fmt: skip
    chats = [ask("A person as JSON."), ask("A date?")]
    for (extra, n, constraint), chat in zip(cases, chats):
        got = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=n,
                                             temperature=0, **extra)  # fmt: skip
        want = fg.generate(model, tokenizer, [chat], max_new_tokens=n, processors=[constraint],
                           sampler=fg.samplers.Greedy())  # fmt: skip
        assert got.choices[0].message.content == want.texts[0]


@contextlib.contextmanager
def compiled_programs():
    """Yield a list that receives the name of every program XLA compiles in the block (JAX's
    `jax_log_compiles` records, "Compiling jit(NAME) ...")."""
    names: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record):
            found = re.match(r"Compiling (\S+?)\(?(\w*)\)? ", record.getMessage())
            if found:
                names.append(found.group(2) or found.group(1))

    handler = Handler(logging.WARNING)
    loggers = [logging.getLogger("jax._src.interpreters.pxla")]
    for logger in loggers:
        logger.addHandler(handler)
    before = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)
    try:
        yield names
    finally:
        jax.config.update("jax_log_compiles", before)
        for logger in loggers:
            logger.removeHandler(handler)


def test_new_schema_compiles_nothing(server, client):
    """After one constrained request, a request with a schema never seen (other table sizes,
    padded to the same pool) and one with a regex compile none of the engine's programs: the
    only compilations are JAX's `stage` programs that copy the new constraint's host tables of
    a new shape to the device while the worker thread builds the processor (`jnp.asarray`,
    milliseconds, off the device thread), which `fg.generate` would do too."""
    _, _, alone_calls = server
    client.chat.completions.create(model=MODEL, messages=ask("A person as JSON."), max_tokens=6,
                                   temperature=0, response_format=schema_format(PERSON))  # fmt: skip
    fresh = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue", "cyan"]},
                       "count": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["colour", "count"],
        "additionalProperties": False,
    }  # fmt: skip
    with count_compilations() as events, compiled_programs() as names:
        got = client.chat.completions.create(model=MODEL, messages=ask("A thing as JSON."),
                                             max_tokens=24, temperature=0,
                                             response_format=schema_format(fresh))  # fmt: skip
        code = client.chat.completions.create(model=MODEL, messages=ask("A code?"), max_tokens=6,
                                              temperature=0,
                                              extra_body={"guided_regex": "[A-Z]{3}[0-9]"})  # fmt: skip
    # the log sees every XLA compilation the monitoring events see
    assert len(names) == events.count("/jax/core/compile/backend_compile_duration"), names
    assert [n for n in names if n != "stage"] == [], names
    jsonschema.validate(json.loads(got.choices[0].message.content), fresh)
    assert re.fullmatch("[A-Z]{3}[0-9]", code.choices[0].message.content)
    assert alone_calls == []


def test_pushdown_constraint_still_runs_alone(server, client):
    """`json_object` compiles to a pushdown automaton: it does not fit the pool and runs alone,
    and still returns a JSON object."""
    _, _, alone_calls = server
    before = len(alone_calls)
    got = client.chat.completions.create(model=MODEL, messages=ask("Some JSON."), max_tokens=12,
                                         temperature=0,
                                         response_format={"type": "json_object"})  # fmt: skip
    assert len(alone_calls) == before + 1
    assert got.choices[0].message.content.startswith("{")


def test_stop_token_ids_and_top_k(server, client, two_layer_model):
    """`stop_token_ids` ends a request at that token (not in the text, counted in the usage,
    finish reason "stop"); `top_k` equals `fg.generate` with that `top_k` (seeded), and
    `top_k=1` is greedy."""
    model, tokenizer = two_layer_model
    greedy = fg.generate(model, tokenizer, PROMPT, max_new_tokens=8)
    ids = [int(t) for t in greedy.token_ids[0]]
    cut = next(i for i in range(2, 8) if ids[i] not in ids[:i])
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                    extra_body={"stop_token_ids": [ids[cut]]})  # fmt: skip
    assert got.choices[0].text == tokenizer.decode(ids[:cut])
    assert got.choices[0].finish_reason == "stop"
    assert got.usage.completion_tokens == cut + 1

    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0,
                                    seed=3, extra_body={"top_k": 1})  # fmt: skip
    assert got.choices[0].text == greedy.texts[0]
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.5,
                                    seed=3, extra_body={"top_k": 4})  # fmt: skip
    want = fg.generate(model, tokenizer, PROMPT, max_new_tokens=8, temperature=1.5, top_k=4,
                       key=jax.random.key(3))  # fmt: skip
    assert got.choices[0].text == want.texts[0]
    with pytest.raises(openai.BadRequestError, match="top_k"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2,
                                  extra_body={"top_k": 100_000})  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="stop_token_ids"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2,
                                  extra_body={"stop_token_ids": [10**9]})  # fmt: skip
