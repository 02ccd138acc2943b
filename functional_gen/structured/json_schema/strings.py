"""Rewriting `type: string`: `format`, `pattern`, `minLength`/`maxLength` (exact, a counted
regex or a length-bounded automaton: `bounded_string`, `dfa_terminal`), excluded strings.
"""

import hashlib
import json
import typing

import numpy as np

from ..automaton import ConstraintError
from ..byte_dfa import (
    REJECT,
    ByteDFA,
    regex_byte_dfa,
    trim,
)
from ..formats import ANY_STRING, FORMATS, SPEC_FORMATS
from ..patterns import (
    LengthBoundError,
    NoStringError,
    bounded_length,
    difference_dfas,
    intersect_dfas,
    json_string_pattern,
    length_bounded_dfa,
)
from . import budgets
from .counter_strings import LONGEST_TOKEN, counter_string_dfa
from .errors import (
    UnsupportedSchemaError,
)
from .keywords import (
    NOT_STRINGS,
)
from .references import (
    NEVER,
)
from .scalars import (
    json_spellings,
    other_strings_regex,
)

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


def rewrite_string(rewriter: "Rewriter", node: dict, path: str):
    """`type: string` (`BY_TYPE`): `format`, `pattern`, `minLength`/`maxLength` and excluded
    strings, as a regex marker or a string automaton (`bounded_string`). `NEVER`
    (`admits_none`) when no string satisfies them."""
    if NOT_STRINGS in node:
        node = dict(node)
        excluded = node.pop(NOT_STRINGS)
        return excluding(rewriter, rewrite_string(rewriter, node, path), excluded, path)
    fmt, pattern = node.get("format"), node.get("pattern")
    lengths = {k: node[k] for k in ("minLength", "maxLength") if k in node}
    for k, v in lengths.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UnsupportedSchemaError(k, path, f"must be a non-negative integer, got {v!r}")
    if (
        "minLength" in lengths
        and "maxLength" in lengths
        and lengths["maxLength"] < lengths["minLength"]
    ):
        return rewriter.admits_none(
            "maxLength",
            path,
            f"minLength {lengths['minLength']} > maxLength {lengths['maxLength']}",
        )
    if fmt is not None and fmt not in FORMATS:
        if fmt in SPEC_FORMATS:
            rewriter.refuse(
                "format", path, f"format {fmt!r} is not supported; supported: {sorted(FORMATS)}"
            )
        fmt = None  # not a JSON Schema format: an annotation
    if fmt is not None and pattern is not None:
        terminal = format_and_pattern(rewriter, fmt, pattern, lengths, path)
        if terminal is not None:
            return terminal
        pattern = None  # refused with strict=False: the format is kept
    if fmt is not None:
        if lengths:
            bounded = bounded_length(
                FORMATS[fmt], lengths.get("minLength", 0), lengths.get("maxLength")
            )
            if bounded is None:  # the format's automaton times a character counter
                terminal = bounded_string(
                    rewriter, FORMATS[fmt], lengths, path, next(iter(lengths))
                )
                if terminal is not None:
                    return terminal
                bounded = FORMATS[fmt]  # refused with strict=False: the format is kept
            return rewriter.marker('"' + bounded + '"')
        return rewriter.marker('"' + FORMATS[fmt] + '"')
    if pattern is not None:
        try:
            body = json_string_pattern(
                pattern,
                min_length=lengths.get("minLength", 0),
                max_length=lengths.get("maxLength"),
            )
        except NoStringError:  # no value here: left out where the schema allows it
            return rewriter.admits_none(
                "pattern", path, f"no string matches pattern {pattern!r} within {lengths}"
            )
        except LengthBoundError:  # the pattern's automaton times a character counter
            try:
                body = json_string_pattern(pattern)
            except ValueError as e:
                rewriter.refuse("pattern", path, str(e))
                return {"type": "string", **lengths}
            terminal = bounded_string(rewriter, body, lengths, path)
            return {"type": "string", **lengths} if terminal is None else terminal
        except ValueError as e:
            rewriter.refuse("pattern", path, str(e))
            return {"type": "string", **lengths}
        return rewriter.marker('"' + body + '"')
    if rewriter.counted_strings and max(lengths.values(), default=0) > budgets.COUNTED_STRING_MIN:
        keyword = "maxLength" if "maxLength" in lengths else "minLength"
        states = budgets.PLAIN_STRING_STATES * max(lengths.values())
        minimum = lengths.get("minLength", 0)
        counter = (
            budgets.COUNTER_STRINGS
            and "maxLength" in lengths
            and minimum <= budgets.COUNTER_MIN_LENGTH
            and lengths["maxLength"] - minimum >= LONGEST_TOKEN.get()
        )
        if counter:  # never spliced: a counter rule is a few hundred states at most
            return counter_terminal(rewriter, lengths["maxLength"], path, minimum)
        if states > budgets.MAX_STRING_STATES:  # refused before building it
            counted = (
                f"; a counter rule takes a `maxLength` with a `minLength` of at most "
                f"{budgets.COUNTER_MIN_LENGTH}, and `maxLength - minLength` of at least the "
                f"vocabulary's longest token ({LONGEST_TOKEN.get()} bytes)"
                if budgets.COUNTER_STRINGS
                else ""
            )
            rewriter.refuse(
                keyword,
                path,
                f"a string of {lengths} needs an automaton of about {states:,} states (the "
                f"limit is {budgets.MAX_STRING_STATES:,}){counted}",
            )
            return {"type": "string"}
        terminal = bounded_string(rewriter, ANY_STRING, lengths, path, keyword)
        return {"type": "string"} if terminal is None else terminal  # None: bounds dropped
    if rewriter.counted_strings and max(lengths.values(), default=0) >= budgets.SHARED_COUNT_MIN:
        # one marker per distinct bounds, so that the grammar form may call one rule for
        # every such string instead of a copy of its counter per use (MaskBench o61653:
        # 40 strings of maxLength 256 in one object, 98,812 states spliced, 28 s)
        regex = rewriter.regex_of({"type": "string", **lengths})
        marker = rewriter.marker(regex)
        rewriter.repeat_weight[marker["const"]] = (max(lengths.values()) - 1) * len(ANY_STRING)
        return marker
    return {"type": "string", **lengths}


def format_and_pattern(rewriter: "Rewriter", fmt: str, pattern: str, lengths: dict, path: str):
    """A string in format `fmt` that `pattern` matches (and within `lengths`): the
    intersection of the two body automata (`patterns.intersect_dfas`), then the character
    counter of `length_bounded_dfa` if there are lengths, as a string automaton (see
    `bounded_string`). `NEVER` when no string is both; `None` when it cannot be built and
    `strict=False` dropped `pattern` (with `strict=True`, `UnsupportedSchemaError`)."""
    try:
        body = intersect_dfas(
            regex_byte_dfa(FORMATS[fmt]),
            regex_byte_dfa(json_string_pattern(pattern)),
            max_states=budgets.MAX_STRING_STATES,
        )
    except ConstraintError:  # no string is in the format and matches the pattern
        return NEVER
    except ValueError as e:
        rewriter.refuse("pattern", path, f"together with `format` {fmt!r}: {e}")
        return None
    if lengths:
        return bounded_string(rewriter, body, lengths, path, next(iter(lengths)))
    return dfa_terminal(rewriter, body, f"{fmt}\0{pattern}", path, "pattern")


def dfa_terminal(
    rewriter: "Rewriter",
    body: ByteDFA,
    source: str,
    path: str,
    keyword: str,
    *,
    quoted: bool = False,
) -> dict:
    """A marker for the string whose body automaton is `body` (`quoted`: the automaton of
    the whole string, quotes included; `source` names it for the placeholder's digest):
    spliced by `json_schema_compile`, a rule of the grammar form."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:24]
    placeholder = f"{_DFA_TERMINAL}{digest}"
    marker = rewriter.marker(placeholder)
    rewriter.dfa_terminals[marker["const"]] = (placeholder, path, keyword)
    if placeholder not in rewriter.dfa_texts:  # the same automaton: quoted once (o39210:
        # 398 strings of the same three lengths took 8.6 s)
        rewriter.dfa_texts[placeholder] = body if quoted else _quoted(body)
    return marker


def counter_terminal(rewriter: "Rewriter", limit: int, path: str, minimum: int = 0) -> dict:
    """A marker for a plain string of `minimum` to `limit` characters too long for a counted
    automaton: a *counter rule* (`counter_strings.counter_string_dfa`, its quoted DFA in
    `Rewriter.dfa_texts` and its register actions in `Rewriter.counter_texts`), which only the
    grammar form calls (`rule_automata.rule_automaton`); the token-DFA form refuses to splice
    it (`regex_form.spliced_dfa`)."""
    counter = counter_string_dfa(limit, minimum)
    marker = dfa_terminal(
        rewriter, counter.dfa, f"counter\0{limit}\0{minimum}", path, "maxLength", quoted=True
    )
    rewriter.counter_texts[rewriter.dfa_terminals[marker["const"]][0]] = counter
    return marker


def excluding(rewriter: "Rewriter", terminal, excluded: list[str], path: str):
    """The string `terminal` (what `_string` returned) without the values `excluded`: the
    difference of its automaton and that of every JSON spelling of them
    (`patterns.difference_dfas`), a string automaton (`dfa_terminal`). `NEVER` when no
    string is left; with `strict=False`, `terminal` itself when it cannot be built."""
    if terminal is NEVER:
        return NEVER
    if terminal == {"type": "string"}:  # any string: a regex does it
        return rewriter.marker(other_strings_regex(excluded))
    regex = rewriter.substitute(rewriter.regex_of(terminal))
    if any(placeholder in regex for placeholder in rewriter.counter_texts):
        rewriter.refuse(
            "not", path, f"the strings other than {excluded} of a string counted by a register"
        )
        return terminal
    strings = string_automaton(rewriter, regex)
    source = f"not\0{regex}\0{json.dumps(excluded)}"
    try:
        strings = strings if strings is not None else regex_byte_dfa(regex)
        forbidden = regex_byte_dfa("|".join(map(json_spellings, excluded)))
        rest = difference_dfas(strings, forbidden, max_states=budgets.MAX_STRING_STATES)
    except ConstraintError:  # every string of `terminal` is excluded
        return NEVER
    except ValueError as e:
        rewriter.refuse("not", path, f"the strings other than {excluded}: {e}")
        return terminal
    return dfa_terminal(rewriter, rest, source, path, "not", quoted=True)


def string_automaton(rewriter: "Rewriter", regex: str) -> ByteDFA | None:
    """The quoted string automaton (`Rewriter.dfa_texts`) that the substituted `regex` is
    exactly (its placeholder inside the groups of marker and const), else `None`."""
    inner = regex
    while inner not in rewriter.dfa_texts and inner.startswith("(?:") and inner.endswith(")"):
        inner = inner[3:-1]
    if inner in rewriter.counter_texts:  # its DFA alone has no limit: not the strings
        return None
    return rewriter.dfa_texts.get(inner)


def bounded_string(rewriter: "Rewriter", body, lengths: dict, path: str, keyword: str = "pattern"):
    """A string whose body matches the regex `body` and whose length lies within
    `lengths` (`minLength`/`maxLength`), when no regex writes that compactly: a marker whose
    regex is a placeholder and whose automaton is `length_bounded_dfa`'s, quoted
    (`dfa_terminals`; only the grammar form can call it, `_dfa_rule`). `NEVER` when no
    string has the lengths; `None` when the automaton would exceed `MAX_STRING_STATES`
    states and `strict=False` dropped the bounds (with `strict=True`,
    `UnsupportedSchemaError` naming `keyword` and the sizes)."""
    lo, hi = lengths.get("minLength", 0), lengths.get("maxLength")
    try:
        dfa = length_bounded_dfa(body, lo, hi, max_states=budgets.MAX_STRING_STATES)
    except ConstraintError:  # no string of these lengths matches
        return NEVER
    except ValueError as e:
        rewriter.refuse(keyword, path, str(e))
        return None
    if isinstance(body, ByteDFA):  # named by its states, as equal automata are equal
        body = hashlib.sha1(body.delta.tobytes() + body.accepting.tobytes()).hexdigest()
    return dfa_terminal(rewriter, dfa, f"{body}\0{lo}\0{hi}", path, keyword)


_DFA_TERMINAL = "\x03FGDFA"
"""Starts the placeholder regex of a string given as an automaton (`bounded_string`):
a control character no schema regex holds, then a digest of the string's regex and lengths."""


def _quoted(body: ByteDFA) -> ByteDFA:
    """The DFA of `"` + `body` + `"`: a JSON string from the DFA of its body, which reads a `"`
    only inside an escape (`\\"`), never where it may end."""
    quote = ord('"')
    if (body.delta[body.accepting, quote] != REJECT).any():
        raise RuntimeError("internal error: a string body DFA reads a raw quote where it may end")
    n = body.num_states
    delta = np.full((n + 2, body.delta.shape[1]), REJECT, np.int32)
    delta[1 : n + 1] = np.where(body.delta != REJECT, body.delta + 1, REJECT)
    delta[0, quote] = body.initial + 1
    delta[1 + np.flatnonzero(body.accepting), quote] = n + 1
    accepting = np.zeros(n + 2, bool)
    accepting[n + 1] = True
    return trim(ByteDFA(delta, accepting, 0))  # minimal when `body` is: no minimisation
