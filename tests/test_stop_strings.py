"""Stop strings: matched on the device across token boundaries, cut from the returned text."""

import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.generation.stop_strings import StopStrings, truncate_at_stop
from functional_gen.tokenization import token_bytes

TEXTS = [
    "Please stop. Then stopping is fine, but unstoppable? Stop!",
    "one\n\ntwo\n\n\nthree",
    "Price: 5€ or 10 €, not €€ — ok",
    "the theme then thereafter, tthhee the",
    "no match here at all",
]
STOPS = ["stop", "\n\n", "€€", "the t", "Stop!"]


def reference_matches(tokenizer, ids, stop):
    """After each token: does the generated text (bytes) so far contain `stop`? (first hit only)"""
    pieces = token_bytes(tokenizer)
    out, text = [], b""
    for t in ids:
        text += pieces[t]
        out.append(stop.encode() in text)
    return out


@pytest.mark.parametrize("stop", STOPS)
def test_device_matcher_equals_substring_search(default_model, stop):
    model, tokenizer = default_model
    matcher = StopStrings.build([stop], tokenizer, model.config.vocab_size)
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        state = matcher.init(1)
        found = []
        for t in ids:
            state, hit = matcher.advance(state, jnp.asarray([t]))
            found.append(bool(hit[0]))
        expected = reference_matches(tokenizer, ids, stop)
        first = expected.index(True) if True in expected else len(ids)
        # identical up to and including the first match (a row stops there)
        assert found[: first + 1] == expected[: first + 1], (stop, text)


def test_several_stop_strings_in_one_matcher(default_model):
    model, tokenizer = default_model
    matcher = StopStrings.build(["zebra", "\n\n"], tokenizer, model.config.vocab_size)
    ids = tokenizer("a line\n\nthen a zebra")["input_ids"]
    state, hits = matcher.init(2), []
    for t in ids:
        state, hit = matcher.advance(state, jnp.asarray([t, ids[0]]))
        hits.append(np.asarray(hit).tolist())
    assert [h[0] for h in hits].index(True) == next(
        i for i in range(len(ids)) if "\n\n" in tokenizer.decode(ids[: i + 1])
    )
    assert not any(h[1] for h in hits)


def test_truncate_at_stop():
    assert truncate_at_stop("abc STOP def stop", ["stop", "STOP"]) == ("abc ", True)
    assert truncate_at_stop("abc", ["x"]) == ("abc", False)


def test_empty_stop_string_is_refused(default_model):
    model, tokenizer = default_model
    with pytest.raises(ValueError, match="non-empty strings"):
        StopStrings.build(["ok", ""], tokenizer, model.config.vocab_size)


@pytest.mark.slow
def test_generation_stops_at_the_string_and_leaves_it_out(default_model):
    model, tokenizer = default_model
    prompts = ["Count from one to ten: one, two,", "Write a list of fruits:\n1."]
    free = fg.generate(model, tokenizer, prompts, max_new_tokens=40)
    stopped = fg.generate(
        model, tokenizer, prompts, max_new_tokens=40, stop_strings=["seven", "\n3"]
    )
    for full, cut, reason in zip(free.texts, stopped.texts, stopped.finish_reasons):
        stop = "seven" if "seven" in full else "\n3"
        assert stop in full
        assert reason == "stop_string"
        assert cut == full[: full.index(stop)]
    # each row stopped on the token that completed its stop string
    for i, n in enumerate(stopped.num_tokens):
        generated = tokenizer.decode(np.asarray(stopped.token_ids[i, :n]).tolist())
        before = tokenizer.decode(np.asarray(stopped.token_ids[i, : n - 1]).tolist())
        stop = "seven" if i == 0 else "\n3"
        assert stop in generated and stop not in before
    pieces = list(
        fg.stream(model, tokenizer, prompts[0], max_new_tokens=40, stop_strings=["seven"])
    )
    assert "".join(pieces) == stopped.texts[0]
