"""Token bytes from the tokenizer's conventions (byte-level BPE, byte fallback), EOS defaults."""

import copy
import json

import pytest

from functional_gen.structured import (
    Choice,
    Grammar,
    JsonSchema,
    Regex,
    vocabulary as vocabulary_module,
)
from functional_gen.structured.vocabulary import (
    default_eos_token_ids,
    token_bytes_table,
    vocabulary_from_tokenizer,
)


def test_byte_level_tokens_are_their_raw_bytes(tokenizer, vocabulary):
    # Every text token's bytes re-encode to the same id, and decoding a run of tokens equals
    # the tokenizer's own decode (the reference for byte-level BPE).
    ids = tokenizer("Ünïcödé café 日本語 😀 and\ttabs\n")["input_ids"]
    assert b"".join(vocabulary.token_bytes[i] for i in ids).decode("utf-8") == tokenizer.decode(ids)
    # Partial UTF-8 tokens are kept as raw bytes, not U+FFFD.
    partial = [b for b in vocabulary.token_bytes if b is not None and not _is_utf8(b)]
    assert len(partial) > 100
    assert all(b"\xef\xbf\xbd" not in b for b in partial)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_special_and_eos_tokens_are_never_text(tokenizer, vocabulary):
    assert vocabulary.eos_token_id == (2, 0)  # <|im_end|>, <|endoftext|>: generation_config.json
    for i in tokenizer.all_special_ids + [3, 4, 16]:
        assert vocabulary.token_bytes[i] is None
    assert vocabulary.vocab_size == len(tokenizer)


def test_default_eos_follows_llama_cpp_end_of_generation_list(tokenizer):
    assert default_eos_token_ids(tokenizer) == (2, 0)


def test_explicit_eos_and_vocab_size(tokenizer):
    v = vocabulary_from_tokenizer(tokenizer, eos_token_id=[2], vocab_size=49_200)
    assert v.eos_token_id == (2,) and v.vocab_size == 49_200
    assert v.token_bytes[49_199] is None
    assert v.fingerprint != vocabulary_from_tokenizer(tokenizer).fingerprint
    with pytest.raises(ValueError, match="eos_token_id"):
        vocabulary_from_tokenizer(tokenizer, eos_token_id=[60_000])
    with pytest.raises(ValueError, match="vocab_size"):
        vocabulary_from_tokenizer(tokenizer, vocab_size=100)


def test_byte_fallback_tokenizer():
    # A Llama-2-style SentencePiece BPE: Metaspace pre-tokenizer, <0xXX> byte tokens.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {
        "<unk>": 0,
        "<s>": 1,
        "</s>": 2,
        "▁caf": 3,
        "é": 4,
        "<0xC3>": 5,
        "<0xB1>": 6,
        "▁": 7,
        "a": 8,
    }
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True)
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    table, special = token_bytes_table(tok)
    assert (
        table[3] == b" caf"
        and table[4] == "é".encode()
        and table[5] == b"\xc3"
        and table[6] == b"\xb1"
    )
    assert table[7] == b" " and {0, 1, 2} <= special
    assert json.loads(tok.backend_tokenizer.to_str())["model"]["byte_fallback"]
    # The bytes of a byte-fallback sequence are what the decoder writes.
    assert (table[5] + table[6]).decode() == tok.decode([5, 6]) == "ñ"


def test_constraints_for_one_tokenizer_convert_its_vocabulary_once(default_model, monkeypatch):
    # A fresh tokenizer object (nothing cached for it), four kinds of constraint: the tokens are
    # converted to bytes once and the default EOS ids looked up once; adding a token (a new
    # length) converts again.
    tokenizer = copy.deepcopy(default_model[1])
    calls = {"bytes": 0, "eos": 0}
    real_bytes, real_eos = (
        vocabulary_module.token_bytes_table,
        vocabulary_module.default_eos_token_ids,
    )

    def counted_bytes(*args):
        calls["bytes"] += 1
        return real_bytes(*args)

    def counted_eos(*args):
        calls["eos"] += 1
        return real_eos(*args)

    monkeypatch.setattr(vocabulary_module, "token_bytes_table", counted_bytes)
    monkeypatch.setattr(vocabulary_module, "default_eos_token_ids", counted_eos)
    Regex("[0-9]{2}", tokenizer)
    Choice(["yes", "no"], tokenizer)
    JsonSchema({"type": "boolean"}, tokenizer)
    Grammar('start: "a"+', tokenizer, max_depth=2)
    Regex("[a-z]", tokenizer, eos_token_id=(2, 0))  # the default ids, given explicitly
    assert calls == {"bytes": 1, "eos": 1}
    assert vocabulary_from_tokenizer(tokenizer) is vocabulary_from_tokenizer(
        tokenizer, eos_token_id=[2, 0]
    )
    tokenizer.add_tokens(["<a-new-token>"])
    assert vocabulary_from_tokenizer(tokenizer).vocab_size == 49_153
    assert calls == {"bytes": 2, "eos": 2}
