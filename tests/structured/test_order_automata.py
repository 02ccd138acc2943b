"""Objects read in any order by an automaton built from their members
(`json_schema.order_automata`): its language against a brute-force enumeration of member
sequences, in both forms, and the refusals."""

import itertools
import random

import pytest

from functional_gen.structured.automaton import ConstraintError
from functional_gen.structured.json_schema import budgets
from functional_gen.structured.json_schema.errors import TooManyPositions
from functional_gen.structured.json_schema.order_automata import (
    any_order_dfa,
    any_order_text,
    is_any_order_text,
)

# members (key, value regex, the values tried); `y` and `yy` share a prefix, `n`'s value is a
# number that could go on (its end is where the next separator starts)
MEMBERS = [
    ("y", '"[a-c]"', ['"a"', '"d"']),
    ("yy", "true|false", ["true", "null"]),
    ("n", "-?[0-9]+", ["12", "-"]),
    ("z", r"\[\]", ["[]"]),
]
EXTRA = ('"x[0-9]"', "null", ['"x1"', '"x"'])  # an additional member: keys x0..x9, value null


def _text(required: list[bool], extra: bool) -> str:
    items = [(f'"{k}"[ ]?:[ ]?(?:{v})', r) for (k, v, _), r in zip(MEMBERS, required)]
    return (
        "(?:" + any_order_text(items, f"{EXTRA[0]}[ ]?:[ ]?null" if extra else None, "[ ]?") + ")"
    )


def _expected(sequence, required: list[bool], extra: bool, form: str) -> bool:
    """Whether an object of the members `sequence` (`(index, value)`, index 4 the additional
    member) is in the form's language: good values only, every required member, each tracked
    one (every listed one in the exact form, the required ones in the `"required"` form, none
    in `"repeat"`, `register_objects`' language) at most once."""
    for j, value in sequence:
        if j < len(MEMBERS) and value != MEMBERS[j][2][0]:
            return False
        if j == len(MEMBERS) and (not extra or value != '"x1"'):
            return False
    listed = [j for j, _ in sequence if j < len(MEMBERS)]
    tracked = [
        j for j in range(len(MEMBERS)) if form == "exact" or (form == "required" and required[j])
    ]
    if any(listed.count(j) > 1 for j in tracked):
        return False
    return all(j in listed for j in range(len(MEMBERS)) if required[j])


def _render(sequence, spaced: bool) -> str:
    parts = []
    for j, value in sequence:
        if j == len(MEMBERS):  # the additional member: a key of the pattern, or not
            key, value = ('"x1"', "null") if value == '"x1"' else ('"x"', "null")
        else:
            key = f'"{MEMBERS[j][0]}"'
        parts.append(f"{key}{': ' if spaced else ':'}{value}")
    return "{" + (", " if spaced else ",").join(parts) + "}"


def _sequences(rng):
    """Every order of every subset of the listed members with good values, each also with the
    additional member somewhere and with a listed one twice, then random sequences."""
    good = [(j, values[0]) for j, (_, _, values) in enumerate(MEMBERS)]
    out = []
    for size in range(len(MEMBERS) + 1):
        for members in itertools.permutations(good, size):
            out.append(list(members))
            at = rng.randrange(size + 1)
            out.append([*members[:at], (len(MEMBERS), '"x1"'), *members[at:]])
            if members:
                out.append([*members, rng.choice(members)])
    choices = [(j, v) for j, (_, _, values) in enumerate(MEMBERS) for v in values]
    choices += [(len(MEMBERS), '"x1"'), (len(MEMBERS), '"x"')]
    for _ in range(600):
        out.append([rng.choice(choices) for _ in range(rng.randrange(7))])
    return out


@pytest.mark.parametrize(
    "required, extra, form",
    [
        ([True, False, True, False], False, "exact"),
        ([True, True, False, False], True, "exact"),
        ([False, False, False, False], True, "exact"),
        ([True, False, True, True], True, "required"),
    ],
)
def test_any_order_dfa_is_the_language_of_member_sequences(required, extra, form, monkeypatch):
    text = _text(required, extra)
    assert is_any_order_text(text)
    if form == "required":  # four listed members over the limit: only the required tracked
        monkeypatch.setattr(budgets, "ORDER_AUTOMATON_MAX", 3)
    dfa = any_order_dfa(text, form=form)
    checked = {True: 0, False: 0}
    for sequence in _sequences(random.Random(0)):
        want = _expected(sequence, required, extra, form)
        for spaced in (False, True):
            document = _render(sequence, spaced)
            assert dfa.matches(document.encode()) == want, (document, want)
        checked[want] += 1
    assert min(checked.values()) > 20  # both verdicts, many times
    for bad in (
        '{"y":"a",}',
        '{,"y":"a"}',
        '{"y":"a""n":1}',
        '{"y":"a"',
        ' {"y":"a"}',
        '{"n":1 2}',
    ):
        assert not dfa.matches(bad.encode()), bad


def test_any_order_dfa_refuses_what_it_cannot_build():
    text = _text([True, True, True, True], True)
    with pytest.raises(TooManyPositions, match="read in any order"):
        any_order_dfa(text, max_states=20)
    # a member whose end could go on like the next separator: not deterministic when joined
    items = [('"a":(?:1|1,)', True), ('"b":2', True)]
    with pytest.raises(ConstraintError, match="may go on with"):
        any_order_dfa("(?:" + any_order_text(items, None, "") + ")")
    assert budgets.ORDER_VALUE_RULE_REGEX < budgets.SHARED_RULE_REGEX


def test_any_order_dfa_tracks_only_the_required_members_where_that_is_far_smaller():
    # two required and two optional members: every listed one tracked is 16 sets, the
    # required ones 4; the smaller form is chosen, which lets an optional key repeat
    text = _text([True, False, True, False], False)
    chosen = any_order_dfa(text)
    assert chosen.num_states < any_order_dfa(text, form="exact").num_states
    assert chosen.matches(b'{"y":"a","yy":true,"n":12,"yy":true}')
    assert not chosen.matches(b'{"y":"a","n":12,"y":"a"}')  # a required one twice
    assert not any_order_dfa(text, form="exact").matches(b'{"y":"a","yy":true,"n":12,"yy":true}')
