"""Pushdown soundness (issue 43, item 3): a row under a pushdown constraint never meets a dead end,
neither at the stack depth nor at `max_new_tokens`, and every text it ends parses.

Random bracket grammars (a seeded RNG), random stack depths and budgets, and a small vocabulary of
every string of up to three bytes over the grammar's alphabet; a sampler biased toward the
tokens that open brackets (the deepest nesting the mask allows). Lark's Earley parser judges the
texts, a breadth-first search over the host configurations (every token walked byte by byte)
gives the fewest tokens of a sentence: both independent of the token tables under test.
"""

import itertools
import json

import jax
import jax.numpy as jnp
import lark
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models import LlamaForCausalLM
from functional_gen.structured import (
    GrammarError,
    NotDeterministic,
    TokenVocabulary,
    parse_grammar,
    vocabulary_from_tokenizer,
)
from functional_gen.structured.byte_dfa import regex_automaton
from functional_gen.structured.json_schema import json_schema_pushdown
from functional_gen.structured.pushdown import PushdownConstraint, build_pushdown, state_stack
from functional_gen.structured.regex_syntax import escape
from functional_gen.testing import tiny_config

from ..structured.helpers import context_for

OPEN = "([{<"
CLOSE = ")]}>"


@pytest.fixture(scope="module")
def smollm_tokenizer(default_model):
    """SmolLM2's tokenizer."""
    return default_model[1]


@pytest.fixture(scope="module")
def smollm_random_model(smollm_tokenizer):
    """A 1-layer random Llama over SmolLM2's vocabulary (samples near-uniformly among the allowed
    tokens)."""
    config = tiny_config(
        vocab_size=len(smollm_tokenizer),
        num_hidden_layers=1,
        eos_token_id=(2, 0),
        pad_token_id=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config, key=jax.random.key(0))


def _random_grammar(rng) -> str:
    """A random grammar of one to three bracket rules: rule `r_i` is an atom or a bracket pair
    around a body of items (other rules, optional or repeated, with separators), some bodies
    mandatory (a rule that must nest before it can end)."""
    count = int(rng.integers(1, 4))
    rules = []
    for i in range(count):
        items = []
        for _ in range(int(rng.integers(1, 3))):
            ref = f"r{int(rng.integers(0, count))}"
            items.append(rng.choice([ref, f"{ref}?", f'{ref} ("," {ref})*', f"{ref}*"]))
        body = " ".join(items)
        atom = f'"{"ab"[i % 2]}{i}"' if rng.random() < 0.8 or i == 0 else None
        alternatives = [f'"{OPEN[i]}" {body} "{CLOSE[i]}"'] + ([atom] if atom else [])
        rules.append(f"r{i}: " + " | ".join(alternatives))
    start = rng.choice(["r0", 'r0 (";" r0)*', "r0+"])
    return f"start: {start}\n" + "\n".join(rules) + "\n"


ALPHABET = [*OPEN, *CLOSE, "a", "b", "0", "1", "2", ",", ";"]
VOCABULARY = TokenVocabulary(
    tuple("".join(t).encode() for n in (1, 2, 3) for t in itertools.product(ALPHABET, repeat=n))
    + (None,),
    (len(ALPHABET) + len(ALPHABET) ** 2 + len(ALPHABET) ** 3,),
    "soundness-brackets",
)
EOS = VOCABULARY.eos_token_id[0]
OPENING = np.asarray(
    [t is not None and any(b in OPEN.encode() for b in t) for t in VOCABULARY.token_bytes]
)


def _grammars(seed: int, count: int):
    """`(text, pda, stack_depth)` for `count` random grammars that build (those that a one-byte
    lookahead cannot decide are skipped; at least half of those drawn build)."""
    rng = np.random.default_rng(seed)
    built, drawn = [], 0
    while len(built) < count:
        drawn += 1
        text = _random_grammar(rng)
        depth = int(rng.integers(1, 7))
        try:
            pda = build_pushdown(parse_grammar(text), VOCABULARY, stack_depth=depth)
        except NotDeterministic:
            continue
        except GrammarError as e:  # no sentence, or none within the depth: said so by name
            assert "no finite sentence" in str(e) or f"stack_depth={depth}" in str(e), e
            continue
        built.append((text, pda, depth))
    assert drawn <= 2 * count + 10, drawn
    return built


def _shortest(pda, limit: int = 12) -> int | None:
    """The fewest tokens of a sentence, by a breadth-first search over the configurations
    (`PushdownAutomaton.walk` of every token, the stack depth enforced), or `None` beyond
    `limit`."""
    frontier, seen = {(pda.initial, ())}, set()
    for n in range(limit + 1):
        if any(pda.can_end(c) for c in frontier):
            return n
        seen |= frontier
        step = set()
        for config in frontier:
            for data in VOCABULARY.token_bytes:
                after = None if data is None else pda.walk(data, config)
                if after is not None and after not in seen:
                    step.add(after)
        frontier = step
    return None


def _sample(pda, rng, max_new_tokens: int, bias: float):
    """A random row under the host mask `PushdownAutomaton.allowed` (what the device computes,
    `test_pda.py` checks): an opening token with probability `bias` where one is allowed.
    Returns `(text, finish_reason)`; `"constraint"` where nothing was allowed."""
    config, text = (pda.initial, ()), b""
    for k in range(max_new_tokens):
        allowed = pda.allowed(config, max_new_tokens - k)
        if not allowed.any():
            return text, "constraint"
        deep = np.flatnonzero(allowed & OPENING)
        if deep.size and rng.random() < bias:
            token = int(rng.choice(deep))
        else:
            token = int(rng.choice(np.flatnonzero(allowed)))
        if token == EOS:
            return text, "eos"
        text += VOCABULARY.token_bytes[token]
        config = pda.walk(VOCABULARY.token_bytes[token], config)
        assert config is not None, text  # an allowed token is read
        assert len(config[1]) <= pda.stack_depth
    return text, "length"


def _parses(parser, text: bytes) -> bool:
    try:
        parser.parse(text.decode())
    except lark.exceptions.LarkError:
        return False
    return True


def test_random_grammars_have_no_dead_ends_and_every_text_parses():
    rng = np.random.default_rng(7)
    for text, pda, depth in _grammars(0, 12):
        parser = lark.Lark(text, parser="earley")
        need = pda.need((pda.initial, ()))
        for max_new_tokens in (need, need + 3, 40):
            for bias in (0.9, 0.5):
                out, reason = _sample(pda, rng, max_new_tokens, bias)
                assert reason != "constraint", (text, depth, max_new_tokens, out)
                # within the budget every row ends inside the language, EOS or not
                assert _parses(parser, out), (text, depth, max_new_tokens, out, reason)


def test_a_sentence_of_n_tokens_fits_in_max_new_tokens_n():
    # The budget counts tokens: with `max_new_tokens` the fewest tokens of a sentence (found by
    # a search over every token), the first step offers a token and the row ends in the language.
    # (A token that ends a rule's frame and goes on in the caller's is not counted as one move by
    # the bound: the vocabulary here holds such tokens, e.g. ")]", so the bound may exceed the
    # truth; it must never be below it, and equals it on most of these grammars.)
    rng = np.random.default_rng(3)
    exact = 0
    grammars = _grammars(1, 10)
    for text, pda, _ in grammars:
        n = _shortest(pda)
        if n is None:
            continue
        bound = pda.need((pda.initial, ()))
        assert bound >= n, (text, bound, n)
        exact += bound == n
        out, reason = _sample(pda, rng, bound, 0.5)
        assert reason != "constraint" and _parses(lark.Lark(text), out), (text, out)
    assert exact >= len(grammars) // 2, exact


def test_stack_depth_never_offers_a_bracket_that_cannot_close():
    # `r1` must nest `r0` before it can end: with three stack slots a row at depth two may not
    # open `<` (it would need two more slots), whatever the bias toward opening.
    grammar = 'start: r1\nr0: "(" r0? ")" | "a"\nr1: "<" r0 r0 ">" | "[" r1 "]"\n'
    pda = build_pushdown(parse_grammar(grammar), VOCABULARY, stack_depth=3)
    parser = lark.Lark(grammar, parser="earley")
    rng = np.random.default_rng(0)
    for _ in range(200):
        out, reason = _sample(pda, rng, 60, 0.95)
        assert reason != "constraint", out
        if reason == "eos":
            assert _parses(parser, out), out


def test_json_schema_pushdown_budget_counts_tokens(smollm_tokenizer, smollm_random_model):
    # Issue 43: an open object (pushdown form) whose shortest document is 34 bytes refused to
    # start with max_new_tokens=24 when the bound counted one-byte tokens. In tokens it needs 7
    # (`{"`, `identifier`, `":"`, ...): a row with that budget writes the whole document.
    schema = {
        "type": "object",
        "properties": {"identifier": {"type": "string"}, "description": {"type": "string"}},
        "required": ["identifier", "description"],
    }
    vocabulary = vocabulary_from_tokenizer(smollm_tokenizer)
    pda = json_schema_pushdown(schema, vocabulary)
    start = (pda.initial, ())
    assert pda.distance[pda.initial] == len(b'{"identifier":"","description":""}')
    need = pda.need(start)
    assert need <= 8  # SmolLM2's own tokenization of that document has 8 tokens
    for max_new_tokens in (need,):  # 24, the budget, is larger still (one compile)
        result = fg.generate(
            smollm_random_model,
            smollm_tokenizer,
            ["a", "b"],
            max_new_tokens=max_new_tokens,
            processors=[fg.processors.JsonSchema(schema, smollm_tokenizer)],
            sampler=fg.samplers.Multinomial(),
            key=jax.random.key(max_new_tokens),
        )
        for text, reason in zip(result.texts, result.finish_reasons):
            assert reason in ("eos", "length"), (max_new_tokens, text, reason)
            assert set(json.loads(text)) >= {"identifier", "description"}, text


def test_the_regex_budget_counts_tokens_too(smollm_tokenizer):
    # The token automaton of a regex: `distance` is a breadth-first search over token
    # transitions, so the same 34-byte document needs its few tokens, not 34.
    vocabulary = vocabulary_from_tokenizer(smollm_tokenizer)
    document = '{"identifier":"","description":""}'
    automaton = regex_automaton(escape(document), vocabulary)
    assert int(automaton.distance[1]) <= len(smollm_tokenizer.encode(document)) < len(document)


def test_device_masks_equal_the_host_near_the_stack_and_the_budget():
    # The jitted step agrees with `PushdownAutomaton.allowed` on random rows of random grammars
    # at small depths and budgets (the exact checks of the best tokens included).
    rng = np.random.default_rng(5)
    for text, pda, _ in _grammars(2, 3):
        step = jax.jit(lambda s, logits, c, processor: processor.process(s, logits, c))
        processor = PushdownConstraint(pda)
        budget = pda.need((pda.initial, ())) + 4
        ids = [0]
        state = processor.init(context_for(ids, 1, max_len=64, max_new_tokens=budget))
        config = (pda.initial, ())
        for k in range(budget):
            context = context_for(ids, 1, max_len=64, max_new_tokens=budget)
            state, logits = step(state, jnp.zeros(VOCABULARY.vocab_size), context, processor)
            assert int(state[0]) == config[0] and state_stack(state) == list(config[1])
            host = pda.allowed(config, budget - k)
            np.testing.assert_array_equal(np.isfinite(np.asarray(logits)), host, err_msg=text)
            deep = np.flatnonzero(host & OPENING)
            token = int(rng.choice(deep if deep.size else np.flatnonzero(host)))
            if token == EOS:
                break
            ids.append(token)
            config = pda.walk(VOCABULARY.token_bytes[token], config)


def test_generate_with_a_bias_toward_nesting_ends_inside_the_grammar(
    smollm_tokenizer, smollm_random_model
):
    # Inside `generate`, a large logit bias on every opening token of SmolLM2's vocabulary: at
    # stack depths 2 and 4 no row ends "constraint", and every text parses.
    tokenizer, random_model = smollm_tokenizer, smollm_random_model
    grammar = 'start: item+\nitem: "(" item* ")" | "[" item ("," item)* "]" | "x"\n'
    parser = lark.Lark(grammar, parser="earley")
    opening = {
        t: 30.0
        for t in range(len(tokenizer))
        if (s := tokenizer.decode([t])) and set(s) <= set("([") and len(s) <= 4
    }
    assert len(opening) >= 4
    for depth, max_new_tokens in ((2, 12), (4, 20)):
        processor = fg.processors.Grammar(grammar, tokenizer, stack_depth=depth)
        result = fg.generate(
            random_model,
            tokenizer,
            ["a", "b", "c", "d"],
            max_new_tokens=max_new_tokens,
            processors=[fg.processors.LogitBias(opening), processor],
            sampler=fg.samplers.Multinomial(),
            key=jax.random.key(depth),
        )
        for out, reason in zip(result.texts, result.finish_reasons):
            assert reason in ("eos", "length"), (depth, out, reason)
            assert _parses(parser, out.encode()), (depth, out, reason)


@pytest.mark.parametrize(
    "grammar, names",
    [
        ('start: "a" start', ["start"]),
        ('start: x\nx: "(" x ")" | "[" x', ["start", "x"]),
    ],
)
def test_a_grammar_without_a_finite_sentence_is_refused_naming_its_rules(
    grammar, names, smollm_tokenizer
):
    # As an empty regex is refused: by the parser (every form), naming the rules that never end.
    for build in (
        lambda: build_pushdown(parse_grammar(grammar), VOCABULARY),
        lambda: fg.processors.Grammar(grammar, smollm_tokenizer),
        lambda: fg.processors.Grammar(grammar, smollm_tokenizer, max_depth=3),
    ):
        with pytest.raises(GrammarError, match="no finite sentence") as caught:
            build()
        for name in names:
            assert repr(name) in str(caught.value)
    gbnf = 'root ::= "a" root'
    with pytest.raises(GrammarError, match="no finite sentence"):
        fg.processors.Grammar.from_gbnf(gbnf, smollm_tokenizer)
