"""Token automata: the device mask against outlines-core's `Guide`, distances against a
breadth-first search of outlines-core's own transition map, the disk cache, the sizes."""

import numpy as np
import pytest
from outlines_core import Guide, Index

import functional_gen as fg
from functional_gen.structured import ConstraintError, json_schema_regex, regex_automaton
from functional_gen.structured import automaton as automaton_module
from functional_gen.structured.automaton import INFINITE_DISTANCE, INITIAL, clear_memory_cache

from .cases import REGEXES, SCHEMAS
from .helpers import context_for

import equinox as eqx
import jax.numpy as jnp

_process = eqx.filter_jit(lambda p, s, logits, c: p.process(s, logits, c))

CASES = [
    ("regex", REGEXES["date"][1]),
    ("regex", REGEXES["email"][1]),
    ("regex", REGEXES["unicode"][1]),
    ("regex", REGEXES["qa"][1]),
    ("schema", SCHEMAS["person"][1]),
    ("schema", SCHEMAS["unicode"][1]),
    ("schema", SCHEMAS["order"][1]),
]


def _outlines_distances(index) -> dict:
    """Fewest tokens from each outlines-core state to a final one (BFS on its own map)."""
    table = index.get_transitions()
    finals = set(index.get_final_states())
    preds: dict[int, set] = {}
    for s, row in table.items():
        for t in row.values():
            preds.setdefault(t, set()).add(s)
    dist = {f: 0 for f in finals}
    frontier = list(finals)
    while frontier:
        nxt = []
        for t in frontier:
            for s in preds.get(t, ()):
                if s not in dist:
                    dist[s] = dist[t] + 1
                    nxt.append(s)
        frontier = nxt
    return dist


@pytest.mark.parametrize("kind,source", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_device_mask_equals_outlines_guide_along_sampled_paths(tokenizer, vocabulary, kind, source):
    processor = fg.processors.Regex(source, tokenizer) if kind == "regex" else fg.processors.JsonSchema(source, tokenizer)
    pattern = source if kind == "regex" else json_schema_regex(source)
    index = Index(pattern, vocabulary.outlines_vocabulary)
    distances = _outlines_distances(index)
    other_eos = [e for e in vocabulary.eos_token_id if e != vocabulary.outlines_eos_id]
    rng = np.random.default_rng(0)
    zeros = jnp.zeros(vocabulary.vocab_size, jnp.float32)
    prompt = [1]
    for _ in range(3):
        guide, path = Guide(index), []
        state = processor.init(context_for(prompt, 1, max_len=128))
        for _step in range(60):
            state, logits = _process(processor, state, zeros, context_for(prompt + path, 1, max_len=128))
            mask = np.asarray(logits) == 0
            expected = np.zeros(vocabulary.vocab_size, bool)
            expected[guide.get_tokens()] = True
            accepting = guide.is_finished() or vocabulary.outlines_eos_id in guide.get_tokens()
            np.testing.assert_array_equal(mask[other_eos], accepting)  # every EOS id, exactly when accepting
            mask[other_eos] = False
            np.testing.assert_array_equal(mask, expected)
            # The distance the device uses is outlines-core's own shortest completion.
            assert int(processor.distance[int(state)]) == distances[guide.get_state()]
            choices = np.flatnonzero(expected)
            choices = choices[choices != vocabulary.outlines_eos_id]
            if choices.size == 0:
                break
            token = int(rng.choice(choices))
            guide.advance(token)
            path.append(token)


def test_tables_are_small_and_never_dense(vocabulary):
    for name in ("product", "book", "team", "recipe"):
        a = regex_automaton(json_schema_regex(SCHEMAS[name][1]), vocabulary)
        assert a.nbytes < 2 * 2**20, (name, a)  # a dense int32 [states, vocab] table would be 35-200 MiB
        assert a.transitions.shape[1] < 300 and a.token_class.shape == (vocabulary.vocab_size,)
        assert a.distance[INITIAL] < INFINITE_DISTANCE and (a.distance[1:] < INFINITE_DISTANCE).all()


def test_disk_cache_round_trip(vocabulary, tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCTIONAL_GEN_CACHE", str(tmp_path))
    clear_memory_cache()
    first = regex_automaton(r"[a-f]{2}-[0-9]+", vocabulary)
    files = list((tmp_path / "automata").glob("regex-*.npz"))
    assert len(files) == 1
    clear_memory_cache()

    def fail(*args, **kwargs):
        raise AssertionError("compiled again instead of loading the cache")

    monkeypatch.setattr(automaton_module, "build_regex_automaton", fail)
    second = regex_automaton(r"[a-f]{2}-[0-9]+", vocabulary)
    for field in ("token_class", "transitions", "distance"):
        np.testing.assert_array_equal(getattr(first, field), getattr(second, field))
    assert second.eos_token_id == vocabulary.eos_token_id
    # Another vocabulary (other EOS ids) is another cache entry.
    from functional_gen.structured.vocabulary import TokenVocabulary

    other = TokenVocabulary(vocabulary.token_bytes, (2,), "other-fingerprint")
    monkeypatch.undo()
    monkeypatch.setenv("FUNCTIONAL_GEN_CACHE", str(tmp_path))
    regex_automaton(r"[a-f]{2}-[0-9]+", other)
    assert len(list((tmp_path / "automata").glob("regex-*.npz"))) == 2
    clear_memory_cache()


@pytest.mark.parametrize("pattern", ["(", "a{3", "[z-a]", "(?=a)b", r"\bword\b"])
def test_invalid_regex_names_the_pattern(tokenizer, pattern):
    with pytest.raises(ConstraintError, match="invalid regex") as info:
        fg.processors.Regex(pattern, tokenizer)
    assert repr(pattern) in str(info.value)


def test_unwritable_regex():
    # A word-level vocabulary of "t0" ... "t99" cannot write an "x".
    from tests.helpers import tiny_tokenizer

    with pytest.raises(ConstraintError, match="cannot write"):
        fg.processors.Regex("x+", tiny_tokenizer(100))
    assert fg.processors.Regex("(t[0-9])+", tiny_tokenizer(100)).num_constraints == 1
