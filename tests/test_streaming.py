"""Streaming: text pieces as tokens arrive, whole UTF-8 characters only."""

import pytest

import functional_gen as fg
from functional_gen.tokenization import IncrementalDecoder, decode


@pytest.mark.slow
def test_pieces_never_split_a_character_and_join_to_the_full_text(default_model):
    _, tokenizer = default_model
    text = "Zoë paid 5€ for 🍕🍕 and said 你好世界 — ça va? 👋🏽"
    ids = tokenizer(text)["input_ids"]
    # the test means something only if some tokens carry part of a UTF-8 character
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(t) for t in ids] + [decoder.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == decode(tokenizer, ids) == text


@pytest.mark.slow
def test_stream_equals_generate(two_layer_model):
    model, tokenizer = two_layer_model
    prompt = [{"role": "user", "content": "Name three colours."}]
    pieces = list(fg.stream(model, tokenizer, prompt, max_new_tokens=24))
    assert len(pieces) > 3 and all(pieces)
    assert "".join(pieces) == fg.generate(model, tokenizer, [prompt], max_new_tokens=24).texts[0]


@pytest.mark.slow
def test_stream_of_a_batch_yields_rows_and_equals_generate(two_layer_model):
    model, tokenizer = two_layer_model
    prompts = ["The capital of France is", [{"role": "user", "content": "Say hi."}]]
    texts = ["", ""]
    stream = fg.stream(model, tokenizer, prompts, max_new_tokens=12)
    for row, piece in stream:
        texts[row] += piece
    expected = fg.generate(model, tokenizer, prompts, max_new_tokens=12)
    assert texts == expected.texts == stream.result.texts
