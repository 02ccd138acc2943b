"""Helpers of the structured-generation tests."""

import jax
import jax.numpy as jnp
import numpy as np

from functional_gen.processors.base import Context


def generated_text(vocabulary, token_ids) -> str:
    """The text of generated token ids, from their raw bytes (stops at EOS)."""
    out = []
    for t in token_ids:
        t = int(t)
        if t in vocabulary.eos_token_id:
            break
        out.append(vocabulary.token_bytes[t])
    return b"".join(out).decode("utf-8")


def context_for(
    token_ids, prompt_length: int, *, max_len: int, max_new_tokens: int = 2**31 - 1
) -> Context:
    """The `Context` of one row whose `token_ids` (prompt + generated) are all valid."""
    ids = np.zeros(max_len, np.int32)
    ids[: len(token_ids)] = token_ids
    return Context(
        token_ids=jnp.asarray(ids),
        length=jnp.asarray(len(token_ids), jnp.int32),
        prompt_length=jnp.asarray(prompt_length, jnp.int32),
        max_new_tokens=jnp.asarray(max_new_tokens, jnp.int32),
        key=jax.random.key(0),
    )


def format_checker():
    """`jsonschema`'s format checker, plus `date-time` and `time` (RFC 3339, with an offset)
    checked with `datetime.fromisoformat`, which jsonschema skips without `rfc3339-validator`."""
    import datetime

    import jsonschema

    checker = jsonschema.FormatChecker()

    @checker.checks("date-time", raises=ValueError)
    def _date_time(value):
        return not isinstance(value, str) or (
            "T" in value and datetime.datetime.fromisoformat(value).tzinfo is not None
        )

    @checker.checks("time", raises=ValueError)
    def _time(value):
        return not isinstance(value, str) or datetime.time.fromisoformat(value).tzinfo is not None

    return checker


def validate_document(text: str, schema) -> None:
    """Raise unless `text` is one JSON document valid under `schema` (a dict, JSON text or a
    pydantic model class), formats included."""
    import json

    import jsonschema

    from functional_gen.structured.json_schema import schema_as_dict

    document = json.loads(text)
    jsonschema.validate(document, schema_as_dict(schema), format_checker=format_checker())
    if isinstance(schema, type):  # pydantic: its own validation too
        schema.model_validate_json(text)


def random_walk(automaton, vocabulary, rng, *, budget: int) -> str:
    """The text of a uniformly random token path through `automaton` that respects the budget
    (the device's rule), ending at EOS or when the budget is spent."""
    state, out = 1, []
    for step in range(budget):
        allowed = np.flatnonzero(automaton.allowed(state, remaining=budget - step))
        assert allowed.size, "a live row always has an allowed token"
        token = int(rng.choice(allowed))
        if token in vocabulary.eos_token_id:
            break
        out.append(token)
        state = automaton.next_state(state, token)
    assert automaton.accepting[state], "a row ends in an accepting state"
    return b"".join(vocabulary.token_bytes[t] for t in out).decode("utf-8")
