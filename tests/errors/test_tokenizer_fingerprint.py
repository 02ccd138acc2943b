"""A `SequenceState` continued, loaded, decoded or joined with another tokenizer than the one
that made it raises `TokenizerMismatchError`, before anything is compiled (issue 43, item 2).
Fingerprints are compared against tokenizers built here, differing in one token, one special
token, or nothing at all."""

import jax
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import functional_gen as fg
from functional_gen.generation.sequence_state import TokenizerMismatchError
from functional_gen.testing import tiny_config
from functional_gen.tokenization import tokenizer_fingerprint

from ..helpers import tiny_tokenizer
from .compilations import count_compilations

VOCAB = 101


def word_tokenizer(words, eos):
    """A word-level fast tokenizer over `words` (id = position)."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token=words[0], pad_token=words[0], eos_token=eos
    )


@pytest.fixture(scope="module")
def tiny():
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
    return model, tiny_tokenizer(VOCAB)


@pytest.fixture(scope="module")
def state(tiny):
    model, tok = tiny
    return fg.generate(model, tok, ["t3 t4 t5", "t9"], max_new_tokens=3, eos_token_id=()).state


@pytest.fixture
def other():
    """Same size and class as the tiny tokenizer; token 50 is spelled differently."""
    words = [f"t{i}" for i in range(VOCAB)]
    words[50] = "fifty"
    return word_tokenizer(words, eos=f"t{VOCAB - 1}")


def test_equal_tokenizers_share_a_fingerprint_and_others_do_not(other):
    a, b = tiny_tokenizer(VOCAB), tiny_tokenizer(VOCAB)
    assert a is not b
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(a)
    # only a special token differs: the EOS is t99 instead of t100
    other_eos = word_tokenizer([f"t{i}" for i in range(VOCAB)], eos="t99")
    assert tokenizer_fingerprint(other_eos) != tokenizer_fingerprint(a)
    # the vocabulary differs in size
    assert tokenizer_fingerprint(tiny_tokenizer(VOCAB + 1)) != tokenizer_fingerprint(a)
    assert tokenizer_fingerprint(object()) is None


def test_the_fingerprint_is_computed_once_per_tokenizer_and_again_after_add_tokens(monkeypatch):
    tok = tiny_tokenizer(VOCAB)
    calls = []
    original = type(tok).get_vocab
    monkeypatch.setattr(type(tok), "get_vocab", lambda self: calls.append(1) or original(self))
    first = tokenizer_fingerprint(tok)
    assert tokenizer_fingerprint(tok) == first
    assert len(calls) == 1
    tok.add_tokens(["brand-new"])
    assert tokenizer_fingerprint(tok) != first
    assert len(calls) == 2


def test_continuing_with_another_tokenizer_is_refused_before_compiling(tiny, state, other):
    model, tok = tiny
    with count_compilations() as compiled, pytest.raises(TokenizerMismatchError) as err:
        fg.generate(model, other, state, max_new_tokens=2)
    assert compiled == []
    message = str(err.value)
    assert "`tokenizer`" in message
    assert tokenizer_fingerprint(tok) in message and tokenizer_fingerprint(other) in message
    assert isinstance(err.value, fg.ModelMismatchError)
    with count_compilations() as compiled, pytest.raises(TokenizerMismatchError):
        next(iter(fg.stream(model, other, state, max_new_tokens=2)))
    assert compiled == []


def test_continuing_with_an_equal_tokenizer_object_is_allowed(tiny, state):
    model, tok = tiny
    same = tiny_tokenizer(VOCAB)
    a = fg.generate(model, same, state, max_new_tokens=2, eos_token_id=())
    b = fg.generate(model, tok, state, max_new_tokens=2, eos_token_id=())
    assert a.token_ids.tolist() == b.token_ids.tolist()
    assert a.texts == b.texts


def test_a_loaded_state_checks_the_tokenizer_it_is_given(tiny, state, other, tmp_path):
    model, _ = tiny
    path = tmp_path / "state.safetensors"
    state.save(path)
    with pytest.raises(TokenizerMismatchError, match=str(path)):
        fg.SequenceState.load(path, tokenizer=other)
    assert fg.SequenceState.load(path, tokenizer=tiny_tokenizer(VOCAB)).texts()
    # loaded without a tokenizer, the recorded fingerprint is still checked on continuing
    loaded = fg.SequenceState.load(path)
    with count_compilations() as compiled, pytest.raises(TokenizerMismatchError):
        fg.generate(model, other, loaded, max_new_tokens=2)
    assert compiled == []
    with pytest.raises(TokenizerMismatchError):
        loaded.texts(other)


def test_decoding_or_joining_with_another_tokenizer_is_refused(tiny, state, other):
    model, _ = tiny
    with pytest.raises(TokenizerMismatchError, match="`tokenizer`"):
        state.texts(other)
    foreign = fg.SequenceState.from_token_ids([[1, 2], [3]], vocab_size=VOCAB, tokenizer=other)
    with pytest.raises(TokenizerMismatchError, match="another tokenizer"):
        state + foreign
    # a state of bare token ids has no fingerprint: it joins, and continues with any tokenizer
    bare = fg.SequenceState.from_token_ids([[1, 2], [3]], vocab_size=VOCAB)
    assert bare.tokenizer_fingerprint is None
    assert len(state + bare) == 2
    continued = fg.generate(model, other, bare, max_new_tokens=1, eos_token_id=())
    assert continued.state.tokenizer_fingerprint == tokenizer_fingerprint(other)
