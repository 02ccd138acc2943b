"""Parallel stacks (`structured.pushdown.parallel`): grammars that one byte of lookahead cannot
decide (llama.cpp's `grammars/c.gbnf`, in `data/`) run as pushdown automata with several
configurations per row, soundly (no dead end, every text parses with lark's Earley parser,
independent of the automaton), and deterministic grammars keep their tables and processor."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import lark
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured.grammar import pushdown_automaton
from functional_gen.structured.grammar_syntax import gbnf_to_lark, parse_grammar
from functional_gen.structured.pushdown import (
    FORK,
    POP,
    NotDeterministic,
    ParallelPushdownConstraint,
    PushdownConstraint,
    build_pushdown,
    state_configurations,
)

from .cases import C_GBNF
from .helpers import context_for


def _nested(depth: int) -> str:
    return "x = 1;" if depth == 0 else f"while(a<b){{{_nested(depth - 1)}}}"


AMBIGUOUS = "if(y>2){return ( f(x)+1 );}else{z = ( 3 );}return (a);elsewhere = 2;"
"""`return (` reads `(` as a call's argument list or a parenthesised expression; `}e` after an
`if` block begins `else` or the next statement's identifier: both need two stacks."""

PROGRAM = "int main(){" + _nested(8) + AMBIGUOUS + "}"

_STEP = jax.jit(lambda state, logits, context, processor: processor.process(state, logits, context))


@pytest.fixture(scope="module")
def c_parser():
    return lark.Lark(gbnf_to_lark(C_GBNF.read_text()), parser="earley")


@pytest.fixture(scope="module")
def c_grammar(tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the bounded-depth DFA
        return fg.processors.Grammar.from_gbnf(C_GBNF, tokenizer, stack_depth=32)


def test_c_gbnf_accepts_eight_nested_blocks_token_by_token(
    c_grammar, c_parser, tokenizer, vocabulary
):
    processor = c_grammar.pushdown
    assert isinstance(processor, ParallelPushdownConstraint) and processor.num_stacks == 4
    assert processor.stack_depth == 32
    c_parser.parse(PROGRAM)  # the test's program is C of the grammar (independent check)
    ids = tokenizer.encode(PROGRAM, add_special_tokens=False)
    assert tokenizer.decode(ids) == PROGRAM
    vocab = len(tokenizer)
    seen, state = [0], processor.init(context_for([0], 1, max_len=160))
    most = 0
    for k, token in enumerate([*ids, None]):
        context = context_for(seen, 1, max_len=160, max_new_tokens=150)
        state, logits = _STEP(state, jnp.zeros(vocab), context, processor)
        allowed = np.isfinite(np.asarray(logits))
        most = max(most, len(state_configurations(state)))
        if token is None:
            assert allowed[list(processor.eos_token_id)].all()  # the program may end here
            break
        assert allowed[token], (k, tokenizer.decode(ids[:k]), tokenizer.decode([token]))
        if k == 3:  # after `int main()`: the grammar has no space before `{`
            assert tokenizer.decode(ids[:3]) == "int main()"
            assert not allowed[tokenizer.encode(" {", add_special_tokens=False)[0]]
        if k > 0:  # inside the program: no EOS (empty text is a program: `declaration*`)
            assert not allowed[list(processor.eos_token_id)].any(), k
        seen.append(token)
    assert most >= 2  # the ambiguous bytes were followed on two stacks at once
    # the host reference (every way, no bound) ends in a configuration that may end
    automaton = pushdown_automaton(
        gbnf_to_lark(C_GBNF.read_text()),
        vocabulary,
        stack_depth=32,
        forks=True,
    )
    assert any(automaton.can_end(c) for c in automaton.walk_all(PROGRAM.encode()))


def test_sampled_c_programs_end_inside_the_grammar(c_grammar, c_parser, tokenizer):
    # Random rows that prefer, where the mask allows them, tokens that open a block, then `)`,
    # `(`, keywords (not right after a letter) and one-character tokens: every row ends with EOS or at the budget with
    # text that parses, and the mask is never empty (no dead end).
    processor, vocab = c_grammar.pushdown, len(tokenizer)
    texts = [tokenizer.decode([t]) for t in range(vocab)]
    keywords = ("while", "if", "return", "else", "int")
    groups = [
        (np.asarray(["{" in s for s in texts]), 0.7),
        (np.asarray([s in (")", ");", "){") for s in texts]), 0.6),
        (np.asarray([s == "(" for s in texts]), 0.8),
        (np.asarray([s in keywords for s in texts]), 0.6),
        (np.asarray([len(s) == 1 for s in texts]), 0.9),
    ]
    rng = np.random.default_rng(1)
    eos, depths, outputs = list(processor.eos_token_id), [], []
    for row in range(4):
        budget = 48
        ids = [0]
        state = processor.init(context_for(ids, 1, max_len=160))
        for _ in range(budget):
            context = context_for(ids, 1, max_len=160, max_new_tokens=budget)
            state, logits = _STEP(state, jnp.zeros(vocab), context, processor)
            allowed = np.isfinite(np.asarray(logits))
            assert allowed.any(), (row, tokenizer.decode(ids[1:]))
            pick = np.flatnonzero(allowed)
            after_word = texts[ids[-1]][-1:].isalnum() and len(ids) > 1
            for group, p in groups:
                if after_word and group is groups[3][0]:
                    continue  # a keyword here would only lengthen an identifier
                preferred = np.flatnonzero(allowed & group)
                if preferred.size and rng.random() < p:
                    pick = preferred
                    break
            token = int(rng.choice(pick))
            if token in eos:
                break
            ids.append(token)
        text = tokenizer.decode(ids[1:])
        c_parser.parse(text)  # EOS or the budget: inside the language
        outputs.append(text)
        depth = most = 0
        for ch in text:
            depth += (ch == "{") - (ch == "}")
            most = max(most, depth)
        depths.append(most)
    assert max(depths) >= 2, outputs  # nested blocks were generated


def test_a_deterministic_grammar_keeps_its_tables_and_processor(tokenizer, vocabulary):
    arithmetic = (
        'start: expr\n?expr: term (("+" | "-") term)*\n?term: factor (("*" | "/") factor)*\n'
        '?factor: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/\n'
    )
    spec = parse_grammar(arithmetic)
    plain = build_pushdown(spec, vocabulary, stack_depth=8)
    forked = build_pushdown(spec, vocabulary, stack_depth=8, forks=True)
    assert forked.num_forks == 0 and forked.fork_tokens.size == 0
    for field in dataclasses.fields(plain):
        a, b = getattr(plain, field.name), getattr(forked, field.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, field.name
            np.testing.assert_array_equal(a, b, err_msg=field.name)
        else:
            assert a == b, field.name
    processor = fg.processors.Grammar(arithmetic, tokenizer, stack_depth=8).pushdown
    assert type(processor) is PushdownConstraint  # one stack: the state is a scalar position
    position, stack, pointer = processor.init(context_for([0], 1, max_len=8))
    assert position.shape == () and stack.shape == (8,) and pointer.shape == ()


def test_one_stack_refuses_the_ambiguous_grammar_by_name(tokenizer, vocabulary):
    lark_text = gbnf_to_lark(C_GBNF.read_text())
    with pytest.raises(NotDeterministic, match=r"the byte b'\(' can be read in 2 ways"):
        pushdown_automaton(lark_text, vocabulary, stack_depth=32, cache=False)
    with pytest.raises(ValueError, match="num_stacks"):
        fg.processors.Grammar.from_gbnf(C_GBNF, tokenizer, num_stacks=0)


def test_past_the_stacks_a_row_stays_sound(vocabulary):
    # Every `(` can open an `x` or a `y` (two ways each time: 2**n readings after n of them);
    # with two stacks most readings are dropped, yet every allowed token is read by a kept one,
    # no row dead-ends and every text parses.
    grammar = 'start: x\nx: "(" x ")" | "(" y "]" | "a"\ny: "(" x "]" | "(" y ")" | "b"\n'
    parser = lark.Lark(grammar, parser="earley")
    automaton = build_pushdown(parse_grammar(grammar), vocabulary, stack_depth=12, forks=True)
    assert automaton.num_forks > 0
    processor = ParallelPushdownConstraint(automaton, num_stacks=2)
    rng = np.random.default_rng(0)
    opening = np.asarray([bool(b) and set(b) <= set(b"(") for b in vocabulary.token_bytes], bool)
    eos = list(automaton.eos_token_id)
    widest = 0
    for row in range(4):
        budget = int(rng.integers(8, 20))
        ids, text = [0], b""
        state = processor.init(context_for(ids, 1, max_len=32))
        for _ in range(budget):
            context = context_for(ids, 1, max_len=32, max_new_tokens=budget)
            state, logits = _STEP(state, jnp.zeros(vocabulary.vocab_size), context, processor)
            allowed = np.isfinite(np.asarray(logits))
            assert allowed.any(), (row, text)  # never a dead end
            deep = np.flatnonzero(allowed & opening)
            pick = deep if deep.size and rng.random() < 0.7 else np.flatnonzero(allowed)
            token = int(rng.choice(pick))
            if token in eos:
                break
            text += vocabulary.token_bytes[token]
            ids.append(token)
            widest = max(widest, len(automaton.walk_all(text)))
        parser.parse(text.decode())  # EOS or the budget: inside the language
    assert widest > 2  # more readings than stacks were met


def _meets_fork(automaton, config, data: bytes) -> bool:
    """Whether reading `data` from `config = (position, stack)` meets a fork on the way (the
    host tables, every way followed; independent of `fork_reach`)."""
    configs = [config]
    for b in data:
        c = automaton.byte_class[b]
        for pos, stack in configs:
            while automaton.next[pos, c] == POP and stack:
                pos, stack = stack[-1], stack[:-1]
            if automaton.next[pos, c] <= FORK:
                return True
        configs = [n for cfg in configs for n in automaton.steps(cfg, b)]
    return False


def _reach_bits(automaton) -> np.ndarray:
    """`fork_reach` unpacked: `Bool[positions, fork_tokens]`."""
    bits = np.unpackbits(automaton.fork_reach.view(np.uint8), axis=1, bitorder="little")
    return bits[:, : automaton.fork_tokens.size].astype(bool)


def _walk_both(automaton, reached, walks, vocab):
    """Step the `ParallelPushdownConstraint` `reached` (of `automaton`) and the same with
    `every_fork_token=True` (every fork token walked over every stack each step: the mask
    before `fork_reach`) along each of `walks` (`(budget, choose)`: `choose(allowed, ids)` the
    next token or None), and check that their states and masks are identical at every step and
    that the state keeps its shapes. Returns the configurations met (`state_configurations`,
    stacks as tuples) and the steps at which a fork token was in `fork_reach` of an alive
    configuration, and at which the budget cut an alive configuration's bitmask row."""
    every = ParallelPushdownConstraint(
        automaton, reached.constraint_id, reached.num_stacks, every_fork_token=True
    )
    met, reaching, cut = set(), 0, 0
    bits = _reach_bits(automaton)
    for budget, choose in walks:
        ids = [0]
        state = reached.init(context_for(ids, 1, max_len=160))
        shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
        reference = state
        for k in range(budget):
            context = context_for(ids, 1, max_len=160, max_new_tokens=budget)
            state, logits = _STEP(state, jnp.zeros(vocab), context, reached)
            reference, expected = _STEP(reference, jnp.zeros(vocab), context, every)
            assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
            jax.tree.map(np.testing.assert_array_equal, state, reference)
            allowed = np.isfinite(np.asarray(logits))
            np.testing.assert_array_equal(allowed, np.isfinite(np.asarray(expected)), str(k))
            configs = state_configurations(state)
            met.update((p, tuple(stack)) for p, stack in configs)
            reaching += any(bits[p].any() for p, _ in configs)
            fits = jax.vmap(reached._bitmask_fits, (0, None))(state, context)
            cut += bool(np.any(~np.asarray(fits) & (np.asarray(state[0]) != 0)))
            token = choose(allowed, ids)
            if token is None or token in automaton.eos_token_id:
                break
            ids.append(token)
    return met, reaching, cut


def _check_reach(automaton, met, rng, samples: int):
    """Every fork token outside `fork_reach[position]` meets no fork from the configurations
    `met` at that position (a sample of `samples` of them per configuration), and `fork_reach`
    is not every fork token everywhere."""
    bits = _reach_bits(automaton)
    tokens = automaton.fork_tokens
    assert bits.any() and not bits.all() and not bits[0].any()  # position 0: dead
    checked = 0
    for config in met:
        outside = np.flatnonzero(~bits[config[0]] & (tokens < automaton.vocab_size))
        for j in rng.choice(outside, min(samples, outside.size), replace=False):
            t = tokens[j]
            data = automaton.token_bytes[t, : automaton.token_length[t]].tobytes()
            assert not _meets_fork(automaton, config, data), (config, data)
            checked += 1
    assert checked >= samples


def test_reached_fork_tokens_mask_as_every_fork_token_on_c(c_grammar, tokenizer, vocabulary):
    # `fork_reach`: per step only the fork tokens that may reach a fork from the positions
    # of the row are walked over every stack. Along a program through both ambiguous bytes
    # (a generous budget, then one that cuts the bitmask rows at the end) and random rows,
    # states and masks equal walking every fork token every step.
    vocab = len(tokenizer)
    automaton = pushdown_automaton(
        gbnf_to_lark(C_GBNF.read_text()), vocabulary, stack_depth=32, forks=True
    )
    bits = _reach_bits(automaton)
    texts = {tokenizer.decode([int(t)]): j for j, t in enumerate(automaton.fork_tokens)}
    assert 0 < bits.any(axis=1).sum() < automaton.num_positions // 4  # few positions reach one
    assert bits[:, texts["else"]].any() and bits[:, texts["("]].any()
    ids = tokenizer.encode("int main(){" + AMBIGUOUS + "}", add_special_tokens=False)
    rng = np.random.default_rng(2)

    def follow(allowed, seen):
        return ids[len(seen) - 1] if len(seen) <= len(ids) else None

    def sample(allowed, seen):
        pick = np.flatnonzero(allowed)
        preferred = np.flatnonzero(allowed & opening)
        return int(rng.choice(preferred if preferred.size and rng.random() < 0.6 else pick))

    opening = np.zeros(vocab, bool)
    for word in ("if(", "{", "}", "else", "(", "e", "return", "x"):
        opening[tokenizer.encode(word, add_special_tokens=False)] = True
    met, reaching, cut = _walk_both(
        automaton,
        c_grammar.pushdown,  # compiled already by the tests above
        [(len(ids) + 8, follow), (len(ids) + 1, follow), (24, sample), (12, sample)],
        vocab,
    )
    assert reaching >= 4 and cut >= 2  # both ways of choosing what to walk were taken
    _check_reach(automaton, met, rng, samples=40)


def test_reached_fork_tokens_mask_as_every_fork_token_past_the_stacks(vocabulary):
    # Two stacks for 2**n readings: readings are dropped inside a token's walk, and still
    # the masks equal walking every fork token.
    grammar = 'start: x\nx: "(" x ")" | "(" y "]" | "a"\ny: "(" x "]" | "(" y ")" | "b"\n'
    automaton = build_pushdown(parse_grammar(grammar), vocabulary, stack_depth=12, forks=True)
    rng = np.random.default_rng(3)
    opening = np.asarray([bool(b) and set(b) <= set(b"(") for b in vocabulary.token_bytes], bool)

    def sample(allowed, seen):
        deep = np.flatnonzero(allowed & opening)
        return int(
            rng.choice(deep if deep.size and rng.random() < 0.7 else np.flatnonzero(allowed))
        )

    walks = [(int(rng.integers(8, 14)), sample) for _ in range(2)]
    processor = ParallelPushdownConstraint(automaton, num_stacks=2)  # as the test above
    met, reaching, _ = _walk_both(automaton, processor, walks, vocabulary.vocab_size)
    assert reaching >= 4
    _check_reach(automaton, met, rng, samples=20)
