"""`Regex`: generated text that matches a regular expression, and regex-writing helpers."""

from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..processors.base import per_row_field
from .byte_dfa import regex_automaton
from .processor import (
    AbstractConstraint,
    ConstraintTables,
    automata_tables,
    rows_of,
)
from .regex_syntax import ascii_classes as ascii_classes, escape as escape
from .vocabulary import vocabulary_from_tokenizer


class Regex(AbstractConstraint):
    """Constrain the generated text to match a regular expression, as a whole.

    The regex is matched against the complete generated text (as with `re.fullmatch`), without
    the end-of-generation token. It is compiled once per (regex, tokenizer) into a token
    automaton (outlines-core compiles the regex into a byte DFA, we lift it to tokens) and cached
    on disk (see `functional_gen.structured.automaton`); the mask and the state advance then run
    on the device inside the jitted loop (see `functional_gen.structured.processor`). A row may only end (EOS, or its last allowed token)
    in an accepting state: generation stops inside the language or with finish reason
    `"constraint"`, never in the middle of a match.

    Syntax is Rust's `regex` crate (the engine of outlines-core): the usual classes, groups,
    alternation and repetition. `\\d` and `\\w` are ASCII by default (`[0-9]`,
    `[0-9A-Za-z_]`, as in JavaScript and JSON Schema; see `ascii_classes`); pass
    `unicode=True` for Rust's Unicode classes. No look-around, backreferences or Unicode `\\b`.
    Every text of the language can be written with any tokenization of it (unlike with
    outlines-core's token `Index` alone, see `byte_dfa.build_regex_automaton`), except text
    containing U+10FFFF.

    !!! Example
        ```python
        model, tokenizer = fg.load_model()
        date = fg.processors.Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", tokenizer)
        fg.generate(model, tokenizer, ["Today is "], processors=[date], max_new_tokens=12).texts
        ```

    **Arguments:**

    - `pattern`: the regex, or a list with one regex per row (`None`: unconstrained row).
    - `tokenizer`: the model's transformers tokenizer.
    - `eos_token_id`: the ids that end generation; default: the tokenizer's EOS plus llama.cpp's
      end-of-generation tokens (`functional_gen.structured.vocabulary.default_eos_token_ids`;
      for SmolLM2 `(2, 0)`). They must be the ids the generation loop stops on.
    - `vocab_size`: the model's vocabulary size when it exceeds the tokenizer's (extra ids are
      never allowed).
    - `unicode`: read `\\d`, `\\w` (and their negations) as Unicode classes (default `False`:
      ASCII).

    **Raises:** `functional_gen.structured.ConstraintError` (a `ValueError`) naming the pattern
    when it does not compile or cannot be written with this vocabulary; `TypeError` for a
    pattern that is not a string.

    Source: the token-level automaton of Willard & Louf, "Efficient Guided Generation for Large
    Language Models" (2023; outlines); outlines-core for the regex to DFA step; the lifting and
    the in-graph tables are ours.
    """

    tables: ConstraintTables
    constraint_id: Int[Array, "*rows"] = per_row_field()

    def __init__(
        self,
        pattern: str | Sequence[str | None],
        tokenizer,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        vocab_size: int | None = None,
        unicode: bool = False,
    ):
        vocabulary = vocabulary_from_tokenizer(
            tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size
        )
        patterns, ids = rows_of(pattern, lambda p: isinstance(p, str), "pattern", "a regex string")
        if not unicode:
            patterns = [ascii_classes(p) for p in patterns]
        self.tables = automata_tables([regex_automaton(p, vocabulary) for p in patterns])
        self.constraint_id = jnp.asarray(ids, jnp.int32)
