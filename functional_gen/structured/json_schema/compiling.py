"""Compiling a schema (`json_schema_compile`): the attempt chain from the cheapest form that
can hold the schema (one regex's token automaton, the grammar form, recursion as rules, the
pushdown form, the single regex, smaller free-value depths) to a clear refusal.
"""

import contextlib
import json
import warnings

from ..automaton import ConstraintError, cached
from ..byte_dfa import (
    lift,
    regex_automaton,
)
from ..pushdown import DEFAULT_STACK_DEPTH, NotDeterministic, TooManyCandidates
from ..regex_syntax import escape
from ..vocabulary import TokenVocabulary
from . import budgets
from .counter_strings import compiles_for_vocabulary
from .dialect import (
    schema_as_dict,
)
from .errors import (
    NotTokenAutomaton,
    RegexTooLarge,
    SchemaTooLargeError,
    TooManyPositions,
    describe,
)
from .free_values import (
    CALL,
    DEFAULT_FREE_FORM_DEPTH,
    FREE_VALUE_CALL,
    NESTED_FREE_FORM_DEPTH,
    FreeValueCall,
)
from .grammar_form import json_schema_grammar
from .pushdown_form import PUSHDOWN_CACHE, pushdown_of_regex
from .references import (
    inline_references,
)
from .regex_form import counter_placeholders, dfa_placeholders, spliced_dfa, spliced_too_large
from .rewriter import Rewriter, rewrite, warn_dropped, warn_order_fixed

_FALLBACK_DEPTHS = (2, 1)
"""The depths the fallback tries in turn when no pushdown automaton can be built: 2 only as the
token automaton of a single regex within `SINGLE_REGEX` (its grammar form is not attempted),
else `NESTED_FREE_FORM_DEPTH` as before. On the 60 fallbacks among MaskBench's dev schemas, 59
nest 2 levels, their compile times summed +8% (median per schema 1.08, at most +0.6 s, the
slowest 2.8 s), and the valid documents of o9795 and sp_193 that nest 2 levels are accepted."""


@compiles_for_vocabulary
def json_schema_compile(
    schema,
    vocabulary: TokenVocabulary,
    *,
    cache: bool = True,
    stack_depth: int = DEFAULT_STACK_DEPTH,
    **options,
):
    """The automaton `JsonSchema` runs for one schema, chosen automatically: the token
    automaton of the schema's single regex (`json_schema_automaton`: smaller and faster) while
    that regex has at most `GRAMMAR_REGEX` characters (with the automata of length-bounded
    strings that no compact regex writes spliced in, `spliced_dfa`), else the grammar form
    (`json_schema_grammar`, a `PushdownAutomaton`), whose free-form values nest as deep as the
    stack unless `free_form_depth=0` (a call of its JSON value rule, where that stays
    deterministic; else nested `free_form_depth` levels as in the regex). With
    `free_form_depth=None` (the default, `DEFAULT_FREE_FORM_DEPTH`), the pushdown automaton of
    `json_schema_pushdown` when the schema has free-form values; an integer nests them that
    many levels in the token automaton.

    **Arguments:** `schema`, `vocabulary`; `cache`: use the caches (the token automaton's
    memory and disk caches; the pushdown automata are memoised in memory only: `False` empties
    that memo first for the grammar form and bypasses it for `json_schema_pushdown`);
    `stack_depth`: of a
    pushdown automaton; `options`: those of `json_schema_regex`.

    With `max_recursion_depth=None` (`JsonSchema`'s default; absent counts as `None`), a
    schema with recursive references compiles first to the grammar form with each recursive
    reference a call of its target's rule (`_recursive_grammar`): nesting is bounded by
    `stack_depth`; when that fails (a call one byte cannot choose, a recursion that never
    ends, one through `allOf` merges) the references are unrolled
    `DEFAULT_MAX_RECURSION_DEPTH` times and compiled as above, with the same result as without
    the attempt. An integer `max_recursion_depth` unrolls that many times, as
    `json_schema_regex` does (a token automaton while the regex is small: what `per_row`
    needs).

    **Returns:** a `TokenAutomaton` or a `PushdownAutomaton`.

    **Raises:** as `json_schema_regex` and `json_schema_grammar`. (With `free_form_depth=None`,
    a free-form value whose call competes with other text for a byte is read in place there,
    level by level while it competes (`inline_value_calls`); if a call still competes
    `_VALUE_CALL_LEVELS` levels down, or the grammar form is too large, it falls back to depth
    2, else `NESTED_FREE_FORM_DEPTH` (`_FALLBACK_DEPTHS`), with a `UserWarning` that names the
    depth, as `JsonSchema` does.)
    """
    token_only = options.pop("_token_automaton_only", False)
    # `nest_instead`'s compile: the call form was tried and failed (not tried again below)
    call_form_failed = options.pop("_call_form_failed", False)
    if not cache:
        PUSHDOWN_CACHE.clear()
    if options.get("max_recursion_depth") is None:
        options.pop("max_recursion_depth", None)
        recursive = _recursive_grammar(schema, vocabulary, stack_depth, options)
        if recursive is not None:
            return recursive
    free = options.get("free_form_depth", DEFAULT_FREE_FORM_DEPTH)
    call = CALL if free is None else None
    rewriter, regex = rewrite(
        schema,
        **{**options, "free_form_depth": call if call is not None else free},
        counted_strings=True,
    )
    if rewriter.order_fixed and call is not None and not token_only:
        # an object too large to read in any order as one regex: the grammar form, which
        # calls its member values as rules, may read it in every order
        ordered = _any_order_grammar(schema, vocabulary, stack_depth, options, rewriter)
        if ordered is not None:
            return ordered

    def nest_instead(
        error: NotDeterministic | TooManyPositions | TooManyCandidates | RegexTooLarge,
        dropped_warned=False,
    ):
        """A free-form value's call competes with other text for its first byte deeper than
        `inline_value_calls` reads it in place (`error` a `NotDeterministic`), or the grammar
        form is too large: the values nested 2 levels where that is a token automaton of a
        single regex within `SINGLE_REGEX`, else `NESTED_FREE_FORM_DEPTH` level(s)
        (`_FALLBACK_DEPTHS`), with a warning that names the depth. A recursive schema is not
        tried deeper: its fallback may still be a pushdown automaton whose recursion nests as
        deep as the stack, which a token automaton would unroll `DEFAULT_MAX_RECURSION_DEPTH`
        times. `dropped_warned`: the
        `strict=False` warning was given already (not repeated)."""

        def warn(depth: int):
            warnings.warn(
                f"JSON Schema: no pushdown automaton ({error}); free-form values nest at most "
                f"{depth} level(s)",
                UserWarning,
                stacklevel=4,
            )

        depths = (NESTED_FREE_FORM_DEPTH,) if _recurses(schema) else _FALLBACK_DEPTHS
        for depth in depths:
            deeper = depth != depths[-1]
            try:
                with warnings.catch_warnings():
                    if dropped_warned:
                        warnings.filterwarnings("ignore", r"JSON Schema: \d+ keyword\(s\) cannot")
                    automaton = json_schema_compile(
                        schema,
                        vocabulary,
                        cache=cache,
                        stack_depth=stack_depth,
                        **{**options, "free_form_depth": depth},
                        **({"_token_automaton_only": True} if deeper else {}),
                        _call_form_failed=True,
                    )
            except (ConstraintError, NotDeterministic):
                if deeper:  # too large that deep: the last depth's result or refusal stands
                    continue
                warn(depth)  # (the refusal follows)
                raise
            warn(depth)
            return automaton
        raise AssertionError("unreachable")

    full: str | None
    try:
        full = rewriter.substitute(regex, limit=budgets.SINGLE_REGEX)
        if (
            call is not None
            and dfa_placeholders(rewriter, full)
            and escape(FREE_VALUE_CALL) in full
        ):
            full = None  # the grammar form calls both
    except RegexTooLarge:
        full = None
    if full is not None and counter_placeholders(rewriter, full):
        full = None  # a counter rule (a long plain string): only the grammar form calls it
    weight = rewriter.weight(regex)
    if full is not None and weight > budgets.SINGLE_REGEX_WEIGHT:
        full = None  # its counted copies written out are too many states for outlines-core
    if token_only and full is None:
        raise NotTokenAutomaton("the single regex is too large for a token automaton")
    if not token_only and (
        full is None or len(full) > budgets.GRAMMAR_REGEX or weight > budgets.GRAMMAR_REGEX
    ):
        if not cache:
            PUSHDOWN_CACHE.clear()
        hopeless = _strings_too_large(rewriter, regex, full is not None)
        if free and call is None and hopeless is None and not call_form_failed:
            # The grammar form is a pushdown automaton already: its free-form values are a call
            # of the JSON value rule, nested as deep as the stack, at no cost over depth 1
            # (15 MaskBench grammar forms: positions -54 each, compile times within noise;
            # Kubernetes kb_972's valid instance with a deeper value accepted). Not after
            # `nest_instead`: the call form failed already; tried again from an uncounted
            # rewrite, its long strings would be regex repeats, not the automata and counter
            # rules the failed form had (MaskBench o9784 with `COUNTER_STRINGS`: a rule with a
            # `{0,32767}` repeat, 220 s in `minimize` before its refusal).
            try:
                return json_schema_grammar(
                    schema,
                    vocabulary,
                    stack_depth=stack_depth,
                    **{**options, "free_form_depth": None},
                )
            except (NotDeterministic, RegexTooLarge):
                pass  # a free-form value where other text may also start (or, its rules
                # inlined where their calls compete, too large: MaskBench jsonld)
        try:
            if hopeless is not None:
                raise hopeless
            return json_schema_grammar(
                schema,
                vocabulary,
                stack_depth=stack_depth,
                _rewritten=(rewriter, regex),
                _over_regex=full is not None,
                **options,
            )
        except (TooManyPositions, TooManyCandidates, NotDeterministic, RegexTooLarge) as e:
            if full is not None:
                pass  # the single regex is within `SINGLE_REGEX`: compiled below
            elif call is None:
                raise
            else:
                # A string automaton spliced beside a free-form value (the token automaton
                # cannot call) made the grammar form too large, or a call competes with other
                # text (or its rules, inlined where their calls compete, are too large:
                # MaskBench jsonld): nest the values as the default does.
                return nest_instead(e)
    assert full is not None
    warn_dropped(rewriter)
    if dfa_placeholders(rewriter, full):
        too_large = spliced_too_large(rewriter, full, weight)
        if too_large is not None:
            raise too_large
        description = f"json schema {describe(schema)}"
        automaton = cached(
            "json-spliced",
            full,
            vocabulary,
            lambda: lift(spliced_dfa(rewriter, full), vocabulary, description),
            cache=cache,
        )
    elif call is not None and escape(FREE_VALUE_CALL) in full:
        options.pop("free_form_depth", None)
        try:
            # `full` is `json_schema_regex(free_form_depth=_CALL)`'s regex: it has no spliced
            # automaton, so the counted strings are the same counted repeats.
            automaton = pushdown_of_regex(
                full,
                schema,
                vocabulary,
                stack_depth,
                options.get("whitespace_pattern"),
                cache,
            )
        except NotDeterministic as e:
            return nest_instead(e, dropped_warned=True)
    else:
        automaton = regex_automaton(
            full, vocabulary, cache=cache, description=f"json schema {describe(schema)}"
        )
    warn_order_fixed(rewriter)
    return automaton


def _any_order_grammar(
    schema, vocabulary: TokenVocabulary, stack_depth: int, options: dict, rewriter: Rewriter
):
    """For `json_schema_compile`: where the rewrite kept some objects' members in the schema's
    order (`rewriter.order_fixed`: tracking them in any order made one regex too large), the
    grammar form of a rewrite that sizes their members as calls (`Rewriter.order_calls`): a
    member value that is a large subschema is a rule called once per member set instead of
    copied, so the object takes its members in any order within the same budgets; an object
    that still does not fit is read by an automaton built from its members
    (`Rewriter.order_by_automata`), and where that form is refused, the rewrite without them is
    tried. `None` (the caller goes on as before) when a rewrite fixes no fewer objects, or its
    grammar form is refused (too many positions, calls one byte cannot choose, a regex too
    large); its warnings are given only when it is returned."""
    for by_automata in (True, False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again = None
            try:
                again, regex = rewrite(
                    schema,
                    **{**options, "free_form_depth": CALL},
                    counted_strings=True,
                    order_calls=True,
                    order_by_automata=by_automata,
                )
                if len(again.order_fixed) >= len(rewriter.order_fixed):
                    return None  # (without automata, it fixes no fewer)
                if _strings_too_large(again, regex, False) is not None:
                    return None
                automaton = json_schema_grammar(
                    schema,
                    vocabulary,
                    stack_depth=stack_depth,
                    _rewritten=(again, regex),
                    **{**options, "free_form_depth": None},
                )
            except (ConstraintError, NotDeterministic):
                if again is None or not again.order_automata:
                    return None
                continue  # the rewrite without automata
        for warning in caught:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
        return automaton
    return None


def _strings_too_large(rewriter: Rewriter, regex: str, over_regex: bool) -> TooManyPositions | None:
    """The refusal of every grammar form of `regex` that its strings given as automata
    (`Rewriter.dfa_terminals`) already imply, before any rule is built: one of them alone has
    more states than the positions a form may have before its tails are shared
    (`MAX_POSITIONS_BEFORE_TAILS`, times `OVER_REGEX_SCALE` when `over_regex`). Each is a rule
    of the grammar form, and written as a counted regex it needs as many states inside its
    rule: no form can do with fewer (MaskBench o1052, a 5,000-character string of 60,003
    states: refused in 2 s instead of after a 7.5 s rule). `None` when no string is that large.
    """
    limit = (budgets.OVER_REGEX_SCALE if over_regex else 1) * budgets.MAX_POSITIONS_BEFORE_TAILS
    for name in sorted(rewriter.markers(regex) & rewriter.dfa_terminals.keys()):
        placeholder, path, keyword = rewriter.dfa_terminals[name]
        states = rewriter.dfa_texts[placeholder].num_states
        if states > limit:
            what = f"the string automaton of `{keyword}` at {path} has {states:,} states"
            return TooManyPositions(states, 1, limit, what)
    return None


def _recurses(schema) -> bool:
    """Whether `schema` (as `json_schema_compile` takes it) has a recursive reference: a quick
    test before the checks and the rewrite (most schemas have no `$ref` at all; the others are
    inlined once more, without the metaschema check). `False` for a schema these steps refuse
    (the unrolled path then reports it)."""
    try:
        schema = schema_as_dict(schema)
        if '"$ref"' not in json.dumps(schema):
            return False
        return bool(inline_references(schema, 1, recursive=True)[1])
    except SchemaTooLargeError:
        raise  # refused at once, not once more by the unrolled path
    except (ValueError, TypeError, RecursionError):
        return False


def _recursive_grammar(schema, vocabulary, stack_depth: int, options: dict):
    """For `json_schema_compile`: the grammar form of a schema with recursive references, each
    recursive target a rule and each recursive reference a call of it
    (`inline_references(recursive=True)`), so that recursion nests as deep as the stack
    (`stack_depth`) instead of `max_recursion_depth` unrolled levels; free-form values are
    calls of the JSON value rule too (unless `free_form_depth=0`; where a call competes with
    other text, read in place there, `inline_value_calls`); when that form is refused, an
    integer `free_form_depth` is tried next, its values nested that many levels.

    **Returns:** the `PushdownAutomaton`, or `None` when the schema has no recursive reference
    or its recursion cannot be rules (a recursive call that a one-byte lookahead cannot choose,
    `NotDeterministic`; a recursion that never ends; any other error of the grammar form, which
    the unrolled path then reports or avoids): the caller unrolls it as before, so every schema
    that compiles unrolled still compiles. Warnings of an attempt that returns `None` are
    dropped (the unrolled path gives its own)."""
    if not _recurses(schema):
        return None
    free = options.get("free_form_depth", DEFAULT_FREE_FORM_DEPTH)
    attempts = [CALL] if free is None else [CALL, free] if free else [0]
    for depth in attempts:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                rewritten = rewrite(
                    schema,
                    **{**options, "free_form_depth": depth},
                    counted_strings=True,
                    recursive=True,
                )
                if rewritten is None or not rewritten[0].recursive:
                    return None  # nothing recurses (or every recursive call was left out)
                grammar_options = {
                    **options,
                    "free_form_depth": None if isinstance(depth, FreeValueCall) else depth,
                }
                automaton = None
                for by_automata in (True, False) if rewritten[0].order_fixed else ():
                    # members in any order where one regex could not track them (as
                    # `_any_order_grammar` does for the other schemas): objects read by
                    # automata built from their members (with a register where their sets are
                    # too many), else without them
                    again = rewrite(
                        schema,
                        **{**options, "free_form_depth": depth},
                        counted_strings=True,
                        recursive=True,
                        order_calls=True,
                        order_by_automata=by_automata,
                    )
                    if len(again[0].order_fixed) < len(rewritten[0].order_fixed):
                        # refused: the next rewrite, then the form below, as before
                        with contextlib.suppress(ConstraintError, NotDeterministic):
                            automaton = json_schema_grammar(
                                schema,
                                vocabulary,
                                stack_depth=stack_depth,
                                _rewritten=again,
                                **grammar_options,
                            )
                    if automaton is not None or not again[0].order_automata:
                        break
                if automaton is None:
                    automaton = json_schema_grammar(
                        schema,
                        vocabulary,
                        stack_depth=stack_depth,
                        _rewritten=rewritten,
                        **grammar_options,
                    )
            except (NotDeterministic, RegexTooLarge):
                continue  # a call one byte cannot choose, or rules inlined too large
            except (ValueError, RecursionError):  # ConstraintError, GrammarError, too deep
                return None
        for warning in caught:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
        return automaton
    return None
