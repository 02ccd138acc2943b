"""Fixtures of the structured-generation tests: the default model's tokenizer and vocabulary,
and a tiny random model with the same vocabulary (fast to compile, samples near-uniformly among
the allowed tokens: a random walk through each automaton)."""

import jax
import numpy as np
import pytest

from functional_gen.models import LlamaForCausalLM
from functional_gen.structured import vocabulary_from_tokenizer
from functional_gen.testing import tiny_config


@pytest.fixture(scope="session")
def tokenizer(default_model):
    """SmolLM2's tokenizer (byte-level BPE, 49,152 ids, EOS ids (2, 0))."""
    return default_model[1]


@pytest.fixture(scope="session")
def vocabulary(tokenizer):
    """The `TokenVocabulary` of SmolLM2's tokenizer."""
    return vocabulary_from_tokenizer(tokenizer)


@pytest.fixture(scope="session")
def random_model(tokenizer):
    """A 1-layer random Llama over SmolLM2's vocabulary, EOS ids (2, 0)."""
    config = tiny_config(
        vocab_size=len(tokenizer),
        num_hidden_layers=1,
        eos_token_id=(2, 0),
        pad_token_id=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config, key=jax.random.key(0))


def _assert_tables_equal(new, old):
    """Two `pushdown.token_tables` results are identical: arrays in dtype, shape and value."""
    assert len(new) == len(old)
    for a, b in zip(new, old):
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b


@pytest.fixture
def checked_token_tables(monkeypatch):
    """`pushdown.token_tables` checked, table for table, against the old walk
    (`tests/structured/pda_reference.py`) on every build; yields the list of checked builds."""
    from functional_gen.structured.pushdown import building

    from .pda_reference import token_tables_reference

    fast, checked = building.token_tables, []

    def both(*args):
        new = fast(*args)
        _assert_tables_equal(new[:5], token_tables_reference(*args))  # new[5]: the moves
        checked.append(args[0].shape[0])
        return new

    monkeypatch.setattr(building, "token_tables", both)
    return checked
