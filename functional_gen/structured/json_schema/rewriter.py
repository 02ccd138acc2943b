"""The traversal core of the rewrite (`Rewriter`): one pass over the schema that checks
keywords and replaces each node outlines-core gets wrong by a `const` marker whose regex it keeps
(`marker`, `substitute`); a node of a JSON type goes to its handler in `BY_TYPE` (numbers,
strings, arrays, objects), applicators to `branches`, recursive targets become rule markers.
`rewrite` runs it over a whole schema.
"""

import json
import re
import typing
import uuid
import warnings
from collections.abc import Mapping, Sequence

from ..automaton import ConstraintError
from ..byte_dfa import (
    ByteDFA,
)
from ..regex_syntax import escape
from . import budgets
from .arrays import rewrite_array
from .branches import structural
from .conditionals import conditional, conditionals_as_branches, negation
from .dialect import (
    check_schema,
    in_dialect,
    schema_as_dict,
)
from .enums import listed_values
from .errors import (
    RecursionRefused,
    RegexTooLarge,
    UnsatisfiableSchemaError,
    UnsupportedSchemaError,
)
from .free_values import (
    DEFAULT_WHITESPACE,
    FREE_VALUE_CALL,
    NESTED_FREE_FORM_DEPTH,
    FreeValueCall,
    free_value,
)
from .keywords import (
    AT_LEAST_ONE,
    JSON_TYPES,
    KNOWN,
    NOT_STRINGS,
    TYPE_KEYWORDS,
    UNSUPPORTED,
)
from .merging import merge
from .numbers import rewrite_integer, rewrite_number
from .objects import dependent_required, rewrite_object
from .order_automata import OrderAutomatonInlined
from .property_order import PROPERTY_ORDERS
from .references import (
    NEVER,
    RECURSIVE,
    inline_references,
)
from .scalars import (
    excluded_strings,
)
from .strings import rewrite_string

CALL_WEIGHT = 12
"""What a rule call costs in a grammar-form regex, for `Rewriter.called_weight`: the length of
`rule_plan.rule_call`'s text (three escaped control characters), the measure `plan_rules` sizes
its rules with (`tests/structured/test_maskbench_dev.py` checks that the two agree)."""

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.

KNOWN.add(NOT_STRINGS)
KNOWN.add(AT_LEAST_ONE)


def rewrite_boolean(rewriter: "Rewriter", node: dict, path: str):
    """`type: boolean` (no keywords of its own)."""
    return {"type": "boolean"}


def rewrite_null(rewriter: "Rewriter", node: dict, path: str):
    """`type: null` (no keywords of its own)."""
    return {"type": "null"}


BY_TYPE: dict = {
    "integer": rewrite_integer,
    "number": rewrite_number,
    "string": rewrite_string,
    "array": rewrite_array,
    "object": rewrite_object,
    "boolean": rewrite_boolean,
    "null": rewrite_null,
}
"""The rewrite of a node of each JSON type (`Rewriter.typed`): `(rewriter, keywords, path) ->
node`, the keywords those of `TYPE_KEYWORDS[type]`."""


DEFAULT_MAX_RECURSION_DEPTH = 3
"""How many times a recursive `$ref` is unrolled (outlines-core's default)."""


class Rewriter:
    """One pass over a schema: checks keywords, rewrites nodes outlines-core gets wrong."""

    def __init__(
        self,
        root: dict,
        *,
        strict: bool = True,
        closed_objects: bool = False,
        whitespace_pattern: str | None = None,
        max_recursion_depth: int = DEFAULT_MAX_RECURSION_DEPTH,
        free_form_depth: "int | FreeValueCall | None" = NESTED_FREE_FORM_DEPTH,
        counted_strings: bool = False,
        property_order: str = "any",
        expansions: Sequence = (),
        origins: Mapping | None = None,
        order_calls: bool = False,
        order_by_automata: bool = False,
    ):
        self.root = root
        self.property_order = property_order
        self.order_calls = order_calls
        """Size the members of objects read in any order as the grammar form will call them
        (`called_weight`: a member value over `SHARED_RULE_REGEX` characters costs a call, not
        a copy), so that objects too large to track as one regex still take every order there
        (`json_schema_compile` sets it for its grammar-form attempt when `order_fixed` is not
        empty)."""
        self.order_by_automata = order_calls and order_by_automata
        """With `order_calls`: an object that would still keep an order is read by an
        automaton built from its members instead (`order_automata`)."""
        self.order_automata: set[str] = set()
        """Markers of objects read in any order by an automaton built from their members
        (`order_automata.any_order_text`, with `order_calls` only): rules of the grammar form,
        never written into a regex (`substitute` refuses them)."""
        self.order_values: set[str] = set()
        """Markers of the member values of `order_automata`'s objects: rules of the grammar
        form from `ORDER_VALUE_RULE_REGEX` characters (`rule_plan.plan_rules`)."""
        self.order_fixed: list[str] = []
        """Paths of the objects read in an order fixed by the schema in part (`object_regex`'s
        `"chained"` or listed order, because tracking the members in any order was too large):
        a valid document whose members come in another order is refused there."""
        self.expansions = list(expansions)
        """The recursive targets' subtrees (`inline_references(recursive=True)`): target `k`'s
        rule body, called by its placeholders (`recursive_call`)."""
        self.bodies = {id(body): k for k, body in enumerate(self.expansions)}
        self.recursive: dict[int, str] = {}
        """Target index -> the marker of its rule, whose substitution is the regex of the
        rewritten target (filled by `fill_recursive` when the target itself is rewritten)."""
        self.filled: set[int] = set()
        self.body_regex: dict[int, str] = {}
        """Target index -> the regex of the rewritten target (its rule's body)."""
        self.recursive_merges = 0
        self.counted_strings = counted_strings
        """Write a plain string with a length bound over `COUNTED_STRING_MIN` as an automaton
        (`bounded_string`) instead of a counted regex repeat (only `json_schema_compile`, which
        splices it, sets this)."""
        self.substitutions: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self.item_repeats: dict[str, tuple[str, int]] = {}
        """Per marker of an array with a large item count (`counted_items`): the marker of its
        items and how many more copies of them its counted repeat writes out."""
        self.repeat_weight: dict[str, int] = {}
        """Per marker of a counted plain string (`SHARED_COUNT_MIN`), the characters its
        counted repeat would add written out (`(count - 1)` times the repeated atom): what its
        automaton costs beyond the regex's length, for `weight` and `plan_rules`."""
        self.tag = uuid.uuid4().hex[:12]
        self.strict, self.closed_objects = strict, closed_objects
        self.whitespace_pattern, self.max_recursion_depth = whitespace_pattern, max_recursion_depth
        self.ws = DEFAULT_WHITESPACE if whitespace_pattern is None else f"(?:{whitespace_pattern})"
        self.dropped: list[str] = []
        if isinstance(free_form_depth, FreeValueCall):
            free_form_depth = None
        self.free_form_depth = free_form_depth
        self.dfa_terminals: dict[str, tuple[str, str, str]] = {}
        """Markers of strings given as automata (`bounded_string`): name -> (placeholder,
        path, keyword)."""
        self.origins = origins or {}
        """`id(subtree) -> (subtree, location)` of the subtrees that references inlined
        (`inline_references(origins=...)`): a node found there is rewritten under its own
        location (`#/$defs/x`), so that what is said of it names the subschema itself."""
        self.empty: list[tuple[str, str, str]] = []
        """`(path, keyword, reason)` of each subschema found to admit no value
        (`admits_none`), in the order met: what `rewrite` names when the whole schema admits
        none."""
        self.dfa_texts: dict[str, ByteDFA] = {}
        """The quoted string DFA of each placeholder of `dfa_terminals`."""
        self.counter_texts: dict = {}
        """The counter rule (`counter_strings.CounterDFA`) of each placeholder of `dfa_texts`
        that is a long plain string counted by a register (`strings.counter_terminal`): its
        DFA in `dfa_texts` has no limit, so only the grammar form may call it."""
        self.inexact: dict[str, str] = {}
        """Markers of objects whose regex may accept the text of an object it does not admit
        or refuse one it admits (read in one order, a key written twice: `object_regex`'s
        `exact`), and why: exact `oneOf` cannot tell such branches apart."""

    def admits_none(self, keyword: str, path: str, reason: str):
        """`NEVER` for the subschema at `path`, which no value satisfies because of `keyword`
        (`reason`, e.g. `minLength 5 > maxLength 2`), remembered in `empty`: where the schema
        allows it the value is left out (an optional property), else `rewrite` names it."""
        self.empty.append((path, keyword, reason))
        return NEVER

    def refuse(self, keyword: str, path: str, reason: str) -> None:
        """A keyword that cannot be enforced: raise (`strict`), or remember it as dropped."""
        if self.strict:
            raise UnsupportedSchemaError(keyword, path, reason)
        self.dropped.append(f"`{keyword}` at {path} ({reason})")

    def any_value(self) -> dict:
        """Any JSON value, nested at most `free_form_depth` levels (a marker of `free_value`),
        or, with `free_form_depth=None`, the character `FREE_VALUE_CALL` that the pushdown
        automaton turns into a call of its recursive JSON value rule."""
        if self.free_form_depth is None:
            return self.marker(escape(FREE_VALUE_CALL))
        return self.marker(free_value(self.free_form_depth, self.ws))

    def regex_of(self, schema) -> str:
        """The regex of a rewritten schema (markers left in, substituted at the end)."""
        # deferred on purpose: the Rust extension loads only when a regex compiles
        from outlines_core.json_schema import build_regex_from_schema

        if schema is NEVER:
            raise RuntimeError("internal error: the regex of NEVER")
        try:
            return (
                "(?:"
                + build_regex_from_schema(
                    json.dumps(schema), self.whitespace_pattern, self.max_recursion_depth
                )
                + ")"
            )
        except (ValueError, RuntimeError) as e:
            raise ConstraintError(
                f"outlines-core cannot convert the JSON Schema: {str(e).splitlines()[0]}"
            ) from None

    def marker(self, regex: str) -> dict:
        """A `const` standing for `regex` (one name per distinct regex, so that a definition
        used in many places is one marker: one rule of the grammar form)."""
        name = self.names.get(regex)
        if name is None:
            name = self.names[regex] = f"FGSUB{len(self.substitutions)}X{self.tag}"
            self.substitutions[name] = regex
        return {"const": name}

    def substitute(self, regex: str, limit: int = budgets.MAX_REGEX) -> str:
        """`regex` with every marker (outlines-core's regex of the marker's `const`, the name
        between quotes) replaced by its regex, markers inside those expanded too: one pass per
        distinct marker, each expanded once (replacing them one at a time over the whole regex
        is quadratic: 9 s for a schema with 17,000 markers).

        **Raises:** `RegexTooLarge` (a `ConstraintError`) when the result would have more than
        `limit` characters (checked before it is built)."""
        found = re.compile(f'"(FGSUB[0-9]+X{self.tag})"')
        if (total := self._expanded_size(regex)) > limit:
            raise RegexTooLarge(total, limit)
        expanded: dict[str, str] = {}

        @typing.no_type_check
        def expand(match) -> str:
            name = match.group(1)
            if name in self.order_automata:
                raise OrderAutomatonInlined(
                    "an object read in any order by its automaton has no regex"
                )
            if name not in expanded:
                expanded[name] = "(?:" + found.sub(expand, self.substitutions[name]) + ")"
            return expanded[name]

        regex = found.sub(expand, regex)
        if f"X{self.tag}" in regex:
            raise RuntimeError("internal error: a marker survived in the regex")
        return regex

    def node(self, node, path: str):
        """The rewritten schema, or `NEVER` when no value can satisfy it."""
        origin = self.origins.get(id(node)) if isinstance(node, Mapping) else None
        if origin is not None and origin[0] is node:  # inlined from a `$ref`: named there
            path = origin[1]
        if isinstance(node, Mapping) and RECURSIVE in node:
            return self.recursive_call(node[RECURSIVE])
        k = self.bodies.get(id(node)) if isinstance(node, Mapping) else None
        if k is not None and k not in self.filled:  # a recursive target: its rule's body too
            self.filled.add(k)
            rewritten = self.node(dict(node), path)
            self.fill_recursive(k, rewritten, path)
            return rewritten
        if node is True or node == {}:
            return self.any_value()
        if node is False or node is NEVER:
            return NEVER
        if not isinstance(node, Mapping):
            raise UnsupportedSchemaError(
                str(node), path, f"a schema must be an object or a boolean, got {node!r}"
            )
        node = dict(node)
        if isinstance(node.get("dependencies"), Mapping):
            # draft 4-7: a list of names is `dependentRequired`, a schema `dependentSchemas`
            dependencies = node.pop("dependencies")
            for key, value in dependencies.items():
                kind = "dependentRequired" if isinstance(value, list) else "dependentSchemas"
                node[kind] = {**node.get(kind, {}), key: value}
        if "not" in node:
            negated = negation(node["not"])
            excluded = (
                None if negated is not None else excluded_strings(self.deref(node["not"], path))
            )
            if negated is not None:  # `not` of a shape whose complement is a schema: exact
                node.pop("not")
                node["allOf"] = [*node.get("allOf", []), negated]
            elif excluded is not None:  # `not` of listed strings: the other strings
                node.pop("not")
                node = merge(self, node, {NOT_STRINGS: excluded}, path)
        if {"if", "then", "else"} & node.keys() or any(
            conditional(part) is not None for part in node.get("allOf", ())
        ):
            node = conditionals_as_branches(node)
        for key in list(node):
            if key in UNSUPPORTED:
                self.refuse(key, path, UNSUPPORTED[key])
            if key not in KNOWN:  # an annotation or an unknown keyword: asserts nothing
                del node[key]
        if "dependentRequired" in node:
            return self.node(dependent_required(self, node, path), path)
        return structural(self, node, path)

    def recursive_call(self, k: int) -> dict:
        """The marker of the rule of recursive target `k` (a placeholder of
        `inline_references(recursive=True)`). Markers are named after their regexes, which the
        target's is not yet: this one is named for the target, and its substitution is filled
        when the target is rewritten (`fill_recursive`, `finish_recursive`)."""
        name = self.recursive.get(k)
        if name is None:
            name = self.recursive[k] = f"FGSUB{len(self.substitutions)}X{self.tag}"
            # the body when the target was rewritten already (a placeholder in another copy
            # of it); else filled by fill_recursive
            self.substitutions[name] = self.body_regex.get(k, "")
        return {"const": name}

    def fill_recursive(self, k: int, rewritten, path: str) -> None:
        """Make `rewritten` (recursive target `k`, rewritten) the body of `k`'s rule.

        **Raises:** `RecursionRefused` when no value satisfies the target (its recursion never
        ends; the unrolled path cuts it where it may)."""
        if rewritten is NEVER:
            raise RecursionRefused(f"no value satisfies the recursive target at {path}")
        self.filled.add(k)
        self.body_regex[k] = self.regex_of(rewritten)
        if k in self.recursive:
            self.substitutions[self.recursive[k]] = self.body_regex[k]

    def finish_recursive(self) -> None:
        """Rewrite the recursive targets whose rules are called but whose subtrees the pass
        over the schema did not rewrite as they are (only merged into others: `allOf`, a
        `$ref` with sibling keywords), until every called rule has its body."""
        while pending := [k for k in self.recursive if k not in self.filled]:
            for k in pending:
                self.filled.add(k)
                body = self.expansions[k]
                self.fill_recursive(k, self.node(dict(body), f"(recursive target {k})"), "")
        if any(not self.substitutions[name] for name in self.recursive.values()):
            raise RuntimeError("internal error: a recursive rule without a body")

    def typed(self, kind, node: dict, path: str):
        """The node of JSON type `kind` (its keywords of that type only) by its handler in
        `BY_TYPE`; any value for `None`.

        **Raises:** `UnsupportedSchemaError` for a type JSON Schema does not define."""
        if kind is None:  # no type information: any JSON value
            return self.any_value()
        if kind not in JSON_TYPES:
            raise UnsupportedSchemaError("type", path, f"unknown type {kind!r}")
        keys = {k: v for k, v in node.items() if k in TYPE_KEYWORDS[kind]}
        return BY_TYPE[kind](self, keys, path)

    def markers(self, regex: str) -> set[str]:
        """The markers `regex` holds, directly or inside the regexes of those it holds."""
        found = re.compile(f'"(FGSUB[0-9]+X{self.tag})"')
        seen: set[str] = set()
        todo = [regex]
        while todo:
            for match in found.finditer(todo.pop()):
                if match.group(1) not in seen:
                    seen.add(match.group(1))
                    todo.append(self.substitutions[match.group(1)])
        return seen

    def weight(self, regex: str) -> int:
        """The length of `regex` with its markers expanded and the counted repeats of plain
        strings written out (`repeat_weight`): a measure of its automaton's size that, unlike
        its length, sees a `{1,256}` (recursive rules count nothing)."""
        return self._expanded_size(regex, weighted=True)

    def called_weight(self, regex: str) -> int:
        """`weight`, but each marker of `regex` whose weight exceeds `SHARED_RULE_REGEX` counted
        as a rule call (`rule_plan.plan_rules` makes a rule of such a marker where it is used
        more than once, as every member of an object read in any order is): the size of
        `regex` in the grammar form's rule that holds it."""
        found = re.compile(f'"(FGSUB[0-9]+X{self.tag})"')
        total = len(regex)
        for match in found.finditer(regex):
            size = self.weight(match.group(0))
            total += (CALL_WEIGHT if size > budgets.SHARED_RULE_REGEX else size) - len(
                match.group(0)
            )
        return total

    def _expanded_size(self, regex: str, weighted: bool = False) -> int:
        """The length of `regex` with every marker expanded (each distinct marker measured
        once), without building it; `weighted`: plus `repeat_weight` per expanded marker, and
        recursive markers count nothing instead of raising `RecursionRefused` (a recursive
        rule has no single regex)."""
        found = re.compile(f'"(FGSUB[0-9]+X{self.tag})"')
        sizes: dict[str, int] = {}
        calls = set(self.recursive.values())

        @typing.no_type_check
        def size(text: str) -> int:
            total = len(text)
            for match in found.finditer(text):
                name = match.group(1)
                if name in calls and not weighted:
                    raise RecursionRefused("a recursive rule has no single regex")
                if name not in sizes:
                    sizes[name] = 0  # a recursion reached again counts nothing more
                    if name not in calls:
                        sizes[name] = 4 + size(self.substitutions[name])
                        if weighted:
                            sizes[name] += self.repeat_weight.get(name, 0)
                            item, copies = self.item_repeats.get(name, (None, 0))
                            sizes[name] += copies * sizes.get(item, 0)
                total += sizes[name] - len(match.group(0))
            return total

        return size(regex)

    def deref(self, node, path: str):
        """`node` itself (references are inlined before the rewrite, `inline_references`), or
        for a recursive placeholder its target's subtree."""
        if isinstance(node, Mapping) and RECURSIVE in node:
            return self.expansions[node[RECURSIVE]]
        return node


def rewrite(
    schema,
    *,
    whitespace_pattern: str | None = None,
    max_recursion_depth: int = DEFAULT_MAX_RECURSION_DEPTH,
    strict: bool = True,
    closed_objects: bool = False,
    free_form_depth: int | FreeValueCall | None = NESTED_FREE_FORM_DEPTH,
    counted_strings: bool = False,
    property_order: str = "any",
    recursive: bool = False,
    order_calls: bool = False,
    order_by_automata: bool = False,
) -> tuple[Rewriter, str] | None:
    """The rewriter after its pass over `schema` and the schema's regex with the markers left
    in (`Rewriter.substitute` expands them; the grammar form makes rules of some). Arguments and
    errors as `json_schema_regex`; `recursive=True` keeps recursive references as markers of
    rules (`inline_references(recursive=True)`, `Rewriter.recursive`: only the grammar form
    can compile them) instead of unrolling them; then `None` when nothing recurses (before the
    rewrite: the caller takes the unrolled path). `order_calls`, `order_by_automata`: see
    `Rewriter.order_calls`, `Rewriter.order_by_automata`."""
    if (
        isinstance(max_recursion_depth, bool)
        or not isinstance(max_recursion_depth, int)
        or max_recursion_depth < 1
    ):
        raise ValueError(
            f"`max_recursion_depth` must be an integer >= 1, got {max_recursion_depth!r}"
        )
    schema = schema_as_dict(schema)
    check_schema(schema)
    schema = listed_values(in_dialect(schema))
    expansions = ()
    origins: dict = {}
    if recursive:
        root, expansions = inline_references(
            schema, max_recursion_depth, recursive=True, origins=origins
        )
        if not expansions:
            return None
    else:
        root = inline_references(schema, max_recursion_depth, origins=origins)
    if not isinstance(free_form_depth, FreeValueCall) and (
        isinstance(free_form_depth, bool)
        or not isinstance(free_form_depth, int)
        or free_form_depth < 0
    ):
        raise ValueError(f"`free_form_depth` must be an integer >= 0, got {free_form_depth!r}")
    if property_order not in PROPERTY_ORDERS:
        raise ValueError(
            f"`property_order` must be one of {PROPERTY_ORDERS}, got {property_order!r}"
        )
    rewriter = Rewriter(
        root,
        strict=strict,
        closed_objects=closed_objects,
        whitespace_pattern=whitespace_pattern,
        max_recursion_depth=max_recursion_depth,
        free_form_depth=free_form_depth,
        counted_strings=counted_strings,
        property_order=property_order,
        expansions=expansions,
        origins=origins,
        order_calls=order_calls,
        order_by_automata=order_by_automata,
    )
    normalized = rewriter.node(root, "#")
    rewriter.finish_recursive()
    if normalized is NEVER and rewriter.empty:
        (path, keyword, reason), *others = rewriter.empty
        raise UnsatisfiableSchemaError(keyword, path, reason, tuple(others[:3]))
    if normalized is NEVER:
        raise UnsupportedSchemaError(
            "$ref",
            "#",
            "no JSON value satisfies the schema (within "
            f"max_recursion_depth={max_recursion_depth} if it is recursive)",
        )
    return rewriter, rewriter.regex_of(normalized)


def warn_dropped(rewriter: Rewriter) -> None:
    """One `UserWarning` listing the keywords a `strict=False` rewrite dropped."""
    if rewriter.dropped:
        warnings.warn(
            f"JSON Schema: {len(rewriter.dropped)} keyword(s) cannot be enforced and were dropped "
            f"(strict=False): " + "; ".join(rewriter.dropped),
            UserWarning,
            stacklevel=3,
        )


def warn_order_fixed(rewriter: Rewriter) -> None:
    """One `UserWarning` listing the objects a rewrite reads in an order fixed in part although
    `property_order="any"` was asked (`Rewriter.order_fixed`: any order was too large to
    compile there), so that a valid document listing their members otherwise is refused: said,
    never silent. Given where the rewrite's regex or automaton is returned, not by attempts
    that fail (a later one may read those objects in every order)."""
    if rewriter.order_fixed and rewriter.property_order == "any":
        paths = sorted(set(rewriter.order_fixed))
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        warnings.warn(
            f"JSON Schema: {len(paths)} object(s) keep their members in the order of "
            "`properties` in part (reading them in any order would make too large an "
            f"automaton): {shown}; a valid document that lists their members in another order "
            "is refused there",
            UserWarning,
            stacklevel=3,
        )
