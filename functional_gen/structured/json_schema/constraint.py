"""The `JsonSchema` constraint: generated text is a JSON document valid under a schema (one
schema, or one per row).
"""

import typing
from collections.abc import Mapping, Sequence

import jax.numpy as jnp
from jaxtyping import Array, Int

from ...processors.base import per_row_field
from ..byte_dfa import (
    regex_automaton,
)
from ..processor import (
    AbstractConstraint,
    ConstraintTables,
    automata_tables,
    pushdown_tables,
    register_token_recipe,
    rows_of,
)
from ..pushdown import DEFAULT_STACK_DEPTH, PushdownAutomaton
from ..vocabulary import vocabulary_from_tokenizer
from .compiling import json_schema_compile
from .errors import describe
from .free_values import DEFAULT_FREE_FORM_DEPTH, NESTED_FREE_FORM_DEPTH
from .regex_form import json_schema_regex
from .rewriter import DEFAULT_MAX_RECURSION_DEPTH


class JsonSchema(AbstractConstraint):
    """Constrain the generated text to be a JSON document valid under a JSON Schema.

    The schema is checked and turned into a regex (`json_schema_regex`: outlines-core's
    conversion plus exact integer/number ranges, strict formats, JSON-safe string patterns,
    merged `allOf`), then compiled like `Regex`. Properties come in any order, additional
    ones among the listed ones (JSON Schema does not order an object's members;
    `PROPERTY_ORDERS` says where a large object's optional members may repeat or its required
    ones keep their listed order among themselves, with a `UserWarning` naming such objects);
    `property_order="schema"` keeps the order
    of the schema (members beside `allOf`/`anyOf`/`oneOf`/`$ref` in the order of those
    keywords in its text, as llguidance orders them; smaller automata);
    optional properties may be left out; whitespace between tokens is none or one space by
    default. Recursive `$ref`s are calls of a rule of a pushdown automaton, nested as deep as
    `stack_depth` allows, where that runs deterministically (`json_schema_compile`); otherwise,
    for a list of schemas, and with an integer `max_recursion_depth`, they are unrolled:
    deeper nesting is not offered, so the output stays valid.

    Every row ends inside the language: the device mask only offers tokens after which the
    document can still be closed within the row's remaining `max_new_tokens` (when the
    schema's shortest document fits the budget at all; otherwise the row ends with finish
    reason `"constraint"`).

    !!! Example
        ```python
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["name", "age"]}
        person = fg.processors.JsonSchema(schema, tokenizer)
        ```

    **Arguments:**

    - `schema`: a dict, a JSON string or a pydantic model class; or a list with one per row
      (`None`: unconstrained row).
    - `tokenizer`, `eos_token_id`, `vocab_size`: as in `Regex`.
    - `whitespace_pattern`: regex of the whitespace allowed between JSON tokens (default
      `[ ]?`). Pass `""` for compact JSON.
    - `max_recursion_depth`: `None` (default): recursive references are rules, as deep as the
      stack, where that is deterministic (a pushdown automaton, which `per_row` cannot combine
      with other constraints), else unrolled `DEFAULT_MAX_RECURSION_DEPTH` (3) times; an
      integer: unrolled that many times (a token automaton for a small schema).
    - `free_form_depth`: how deep free-form values (`{}`, additional properties of open
      objects, arrays without `items`) nest. `None` (default, `DEFAULT_FREE_FORM_DEPTH`): as
      deep as the stack of a pushdown automaton allows (`json_schema_pushdown`), when the
      schema has such values and one can be built (otherwise 2 levels in a token automaton
      where its single regex is small enough, else `NESTED_FREE_FORM_DEPTH` = 1, with a
      `UserWarning` that says why and how deep); an integer: that many levels in the token
      automaton; a list of schemas nests them 1 level. The grammar form below, a pushdown
      automaton anyway, nests them as deep as the stack for any depth but 0. The pushdown
      form keeps `max_new_tokens` as the token automaton does (rows end inside the language),
      its decode step costs the same within noise and it compiles as fast as depth 1 (see
      `DEFAULT_FREE_FORM_DEPTH`). `per_row` uses its token form (with a warning).
    - `stack_depth`: stack slots of the pushdown automaton (default 32).
    - `property_order`: `"any"` (default), `"schema"` or `"schema_or_required_first"`, see
      `PROPERTY_ORDERS`.

    The automaton is chosen automatically (`json_schema_compile`): a single schema whose regex
    would exceed `GRAMMAR_REGEX` characters compiles to its grammar form, a pushdown
    automaton whose rules are its large subschemas (`json_schema_grammar`); a list of schemas
    (one per row) always uses token automata. A `pattern` or `format` with
    `minLength`/`maxLength` is exact (lengths in decoded characters): when no compact regex
    writes it, its automaton (the string's DFA times a character counter) is spliced into the
    schema's, which a list of schemas cannot do (refused there with the reason). Numbers with
    decimal bounds (`minimum: 0.5`) are exact too, written without exponents. The grammar
    form's rule automata are built on one thread per core (at most 4; outlines-core builds a
    DFA without the GIL): the result is the same as built one by one.

    **Raises:** `SchemaTooLargeError` for a schema over 1 MiB of JSON text
    (`budgets.MAX_SCHEMA_BYTES`), before it is checked; `InvalidSchemaError` for a schema its
    metaschema rejects; `UnsatisfiableSchemaError` for a schema no value satisfies, naming the
    subschema and keyword (`#/properties/a: minLength 5 > maxLength 2`);
    `UnsupportedSchemaError` (a `ValueError`) naming the keyword and its location
    (e.g. `not`, `uniqueItems`, `multipleOf: 5`, an unknown `format`) before any compilation,
    or naming a length-bounded string whose automaton, spliced in, would take the schema's over
    150,000 states (`MAX_SPLICED_STATES`; estimated from the regex before its DFA is built);
    `ConstraintError` for a schema too large even for the grammar form (over 10,000 automaton
    positions, `MAX_GRAMMAR_POSITIONS`: its token tables would take more than seconds);
    `ValueError` for invalid JSON text; `TypeError` for a schema of another type.

    Source: outlines-core `json_schema.build_regex_from_schema`; JSON Schema 2020-12.
    """

    tables: ConstraintTables
    constraint_id: Int[Array, "*rows"] = per_row_field()

    def __init__(
        self,
        schema,
        tokenizer,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        vocab_size: int | None = None,
        whitespace_pattern: str | None = None,
        max_recursion_depth: int | None = None,
        strict: bool = True,
        closed_objects: bool = False,
        free_form_depth: int | None = DEFAULT_FREE_FORM_DEPTH,
        stack_depth: int = DEFAULT_STACK_DEPTH,
        property_order: str = "any",
    ):
        @typing.no_type_check
        def is_single(s):
            return isinstance(s, (Mapping, str, bool)) or (
                isinstance(s, type) and hasattr(s, "model_json_schema")
            )

        schemas, ids = rows_of(
            schema,
            is_single,
            "schema",
            "a JSON Schema (a dict, JSON text or a pydantic model class)",
        )
        if len(schemas) == 1:
            vocabulary = vocabulary_from_tokenizer(
                tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size
            )
            automaton = json_schema_compile(
                schemas[0],
                vocabulary,
                stack_depth=stack_depth,
                whitespace_pattern=whitespace_pattern,
                max_recursion_depth=max_recursion_depth,
                strict=strict,
                closed_objects=closed_objects,
                free_form_depth=free_form_depth,
                property_order=property_order,
            )
            self.constraint_id = jnp.asarray(ids, jnp.int32)
            if isinstance(automaton, PushdownAutomaton):
                options = dict(
                    whitespace_pattern=whitespace_pattern,
                    strict=strict,
                    closed_objects=closed_objects,
                    property_order=property_order,
                    free_form_depth=(
                        NESTED_FREE_FORM_DEPTH if free_form_depth is None else free_form_depth
                    ),
                    max_recursion_depth=(
                        DEFAULT_MAX_RECURSION_DEPTH
                        if max_recursion_depth is None
                        else max_recursion_depth
                    ),
                )
                source = schemas[0]
                recipe = register_token_recipe(
                    lambda: regex_automaton(
                        json_schema_regex(source, **options),
                        vocabulary,
                        description=f"json schema {describe(source)}",
                    ),
                    f"free-form values nest {options['free_form_depth']} level(s), recursive "
                    f"references unrolled {options['max_recursion_depth']} times",
                )
                self.tables = pushdown_tables(automaton, ids, token_recipe=recipe)
            else:
                self.tables = automata_tables([automaton])
            return
        if free_form_depth is None:
            free_form_depth = NESTED_FREE_FORM_DEPTH  # one token automaton per row
        if max_recursion_depth is None:
            max_recursion_depth = DEFAULT_MAX_RECURSION_DEPTH  # unrolled in token automata
        regexes = [
            json_schema_regex(
                s,
                whitespace_pattern=whitespace_pattern,
                max_recursion_depth=max_recursion_depth,
                strict=strict,
                closed_objects=closed_objects,
                free_form_depth=free_form_depth,
                property_order=property_order,
            )
            for s in schemas
        ]
        vocabulary = vocabulary_from_tokenizer(
            tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size
        )
        automata = [
            regex_automaton(r, vocabulary, description=f"json schema {describe(s)}")
            for s, r in zip(schemas, regexes)
        ]
        self.tables = automata_tables(automata)
        self.constraint_id = jnp.asarray(ids, jnp.int32)
