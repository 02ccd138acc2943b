"""`Choice`: the generated text is exactly one of a list of strings."""

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
from .regex_syntax import escape
from .vocabulary import vocabulary_from_tokenizer


def choice_regex(options: Sequence[str]) -> str:
    """A regex that matches exactly the strings of `options`.

    Longer options come first (with leftmost-first alternation a plain `cat|category` regex
    could never complete `category`; our compilation does not need it, but the regex stays
    usable anywhere).

    **Raises:** `TypeError` for something else than a list of strings; `ValueError` for an
    empty list, an empty option, or duplicates.
    """
    if isinstance(options, str) or not isinstance(options, Sequence):
        raise TypeError(f"`options` must be a list of strings, got {options!r}")
    if not options:
        raise ValueError("`options` is empty: give at least one string")
    for o in options:
        if not isinstance(o, str):
            raise TypeError(f"each option must be a string, got {o!r} in {list(options)!r}")
        if not o:
            raise ValueError(
                f"each option must be a non-empty string, got {o!r} in {list(options)!r}"
            )
    if len(set(options)) != len(options):
        duplicates = sorted({o for o in options if list(options).count(o) > 1})
        raise ValueError(f"`options` has duplicates: {duplicates}")
    ordered = sorted(options, key=lambda o: (-len(o.encode()), o))
    return "(?:" + "|".join(escape(o) for o in ordered) + ")"


def _is_options(value) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and all(isinstance(o, str) for o in value)
        and len(value) > 0
    )


class Choice(AbstractConstraint):
    """Constrain the generated text to be exactly one of `options`.

    Compiled as the regex `choice_regex(options)` (see `Regex` for the machinery): the model
    picks among the options token by token, with the probabilities it gives them, and the row
    ends right after a complete option (with EOS, or at `max_new_tokens`). An option that is a
    prefix of another may be continued into the longer one.

    !!! Example
        ```python
        sentiment = fg.processors.Choice(["positive", "negative", "neutral"], tokenizer)
        ```

    **Arguments:**

    - `options`: the strings, or a list with one list of strings per row (`None`: unconstrained
      row).
    - `tokenizer`, `eos_token_id`, `vocab_size`: as in `Regex`.

    **Raises:** `TypeError` for options that are not a list of strings; `ValueError` for an empty
    list, an empty option, or duplicate options.

    Source: outlines' `choice` (`generate.choice`), compiled through outlines-core.
    """

    tables: ConstraintTables
    constraint_id: Int[Array, "*rows"] = per_row_field()

    def __init__(
        self,
        options: Sequence[str] | Sequence[Sequence[str] | None],
        tokenizer,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        vocab_size: int | None = None,
    ):
        vocabulary = vocabulary_from_tokenizer(
            tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size
        )
        if isinstance(options, str):
            raise TypeError(f"`options` must be a list of strings, got the string {options!r}")
        groups, ids = rows_of(options, _is_options, "options", "a non-empty list of strings")
        automata = []
        for group in groups:
            pattern = choice_regex(list(group))
            automata.append(
                regex_automaton(pattern, vocabulary, description=f"choice {list(group)!r}")
            )
        self.tables = automata_tables(automata)
        self.constraint_id = jnp.asarray(ids, jnp.int32)
