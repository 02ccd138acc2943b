"""Read a context-free grammar written in (a subset of) Lark's EBNF.

Lark (https://lark-parser.readthedocs.io) is the grammar format of the `lark` parser, which the
tests use as the reference parser: the same grammar text that constrains generation parses its
output. The subset:

```lark
start: expr                     // rules: lowercase names; `?rule` and `!rule` accepted
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | "(" expr ")" | "-" factor
NUMBER: /[0-9]+(\\.[0-9]+)?/     // terminals: UPPERCASE names, strings and /regexes/
%import common.WS               // common.lark terminals: INT, NUMBER, ESCAPED_STRING, CNAME, WS, ...
%ignore WS                      // may appear between any two items
```

The grammar is read by lark's own loader (`lark.load_grammar.GrammarBuilder`), so the syntax,
`%import` (of lark's grammars: `common`, ...), `%override`, `%extend` and the error messages are
lark's. Expressions: sequences, `a | b`, `(...)`, `[...]` and `x?` (optional), `x*`, `x+`,
`x ~ n`, `x ~ n..m`, string literals `"..."` (`"..."i` case-insensitive), character ranges
`"a".."z"`, regexes `/.../` (flags `i`, `s`; Rust `regex` syntax, the common subset of
Python's), aliases `-> name` (ignored: they shape trees, not the language), priorities
`rule.2:` and rule modifiers `?rule`, `!rule` (ignored). Refused by name: templates
(`rule{param}`), `%declare`, other regex flags. Terminals imported from `common` use the regexes
below (lark writes ESCAPED_STRING with a look-behind, which outlines-core does not support).

Source: Lark's grammar reference ("Grammar Reference", lark-parser.readthedocs.io) and its
`grammars/common.lark`.
"""

import ast
import dataclasses
import re

from .regex_syntax import escape

# lark's common.lark, with ESCAPED_STRING written without look-behind (the same language).
COMMON_TERMINALS = {
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+\-]?[0-9]+",
    "DECIMAL": r"(?:[0-9]+\.[0-9]*|\.[0-9]+)",
    "_EXP": r"[eE][+\-]?[0-9]+",
    "FLOAT": r"(?:[0-9]+[eE][+\-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+\-]?[0-9]+)?)",
    "SIGNED_FLOAT": r"[+\-]?(?:[0-9]+[eE][+\-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+\-]?[0-9]+)?)",
    "NUMBER": r"(?:[0-9]+[eE][+\-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+\-]?[0-9]+)?|[0-9]+)",
    "SIGNED_NUMBER": r"[+\-]?(?:[0-9]+[eE][+\-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+\-]?[0-9]+)?|[0-9]+)",
    "ESCAPED_STRING": r'"(?:[^"\\\n]|\\[^\n])*"',
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[A-Za-z]",
    "WORD": r"[A-Za-z]+",
    "CNAME": r"[_A-Za-z][_A-Za-z0-9]*",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "CR": r"\r",
    "LF": r"\n",
    "NEWLINE": r"(?:\r?\n)+",
    "SH_COMMENT": r"#[^\n]*",
    "CPP_COMMENT": r"//[^\n]*",
    "SQL_COMMENT": r"--[^\n]*",
}


class GrammarError(ValueError):
    """A grammar that cannot be read or is not supported; the message names the line."""


# --------------------------------------------------------------------------- syntax tree


@dataclasses.dataclass(frozen=True)
class Seq:
    """Items one after another (the empty sequence is the empty string)."""

    items: tuple


@dataclasses.dataclass(frozen=True)
class Alt:
    """One of the alternatives."""

    options: tuple


@dataclasses.dataclass(frozen=True)
class Repeat:
    """`item` between `low` and `high` times (`high=None`: unbounded)."""

    item: object
    low: int
    high: int | None


@dataclasses.dataclass(frozen=True)
class Ref:
    """A reference to a rule."""

    name: str


@dataclasses.dataclass(frozen=True)
class Terminal:
    """A regular piece of text, as a regex (Rust `regex` syntax)."""

    regex: str


@dataclasses.dataclass
class GrammarSpec:
    """A parsed grammar.

    **Attributes:** `rules`: rule name -> expression over `Seq`, `Alt`, `Repeat`, `Ref`,
    `Terminal`; `ignore`: regexes that may appear between items; `start`: the start rule.
    """

    rules: dict
    ignore: list
    start: str


# --------------------------------------------------------------------------- reading


def _string_value(token: str) -> tuple[str, bool]:
    insensitive = token.endswith("i")
    body = token[:-1] if insensitive else token
    try:
        value = ast.literal_eval(body)
    except (ValueError, SyntaxError) as e:
        raise GrammarError(f"bad string literal {token}: {e}") from None
    return value, insensitive


def _regex_value(token: str) -> str:
    end = token.rindex("/")
    body, flags = token[1:end].replace("\\/", "/"), token[end + 1 :]
    unsupported = set(flags) - {"i", "s"}
    if unsupported:
        raise GrammarError(f"regex flags {sorted(unsupported)} are not supported in {token}")
    return f"(?{flags}:{body})" if flags else f"(?:{body})"


def _class_char(ch: str) -> str:
    return ch if ch.isalnum() and ch.isascii() else f"\\x{{{ord(ch):X}}}"


_COMMON_IMPORT = re.compile(
    r"^\s*%import\s+common\s*(?:\.\s*(\w+)(?:\s*->\s*(\w+))?|\(([^)]*)\))", re.MULTILINE
)


def _common_imports(text: str) -> dict[str, str]:
    """`{local name: regex}` of the `%import common...` lines whose terminal has a regex of ours
    (lark's `common.lark` writes ESCAPED_STRING with a look-behind, which outlines-core lacks)."""
    out = {}
    for m in _COMMON_IMPORT.finditer(text):
        pairs = (
            [(m.group(1), m.group(2) or m.group(1))]
            if m.group(1)
            else [(n.strip(), n.strip()) for n in m.group(3).split(",") if n.strip()]
        )
        for name, alias in pairs:
            if name in COMMON_TERMINALS:
                out[alias] = COMMON_TERMINALS[name]
    for m in re.finditer(r"^\s*%(?:override|extend)\s+(\w+)", text, re.MULTILINE):
        out.pop(m.group(1), None)  # redefined: lark's tree holds the new definition
    return out


def parse_grammar(text: str, start: str = "start") -> GrammarSpec:
    """Read a Lark grammar with lark's own grammar loader (see the module docstring).

    lark checks the syntax, resolves `%import`, `%override` and `%extend`, and reports undefined
    or doubly defined names; we turn its rule and terminal trees (before EBNF is lowered) into
    `Seq`/`Alt`/`Repeat`/`Ref`/`Terminal`, with every terminal inlined as one regex.

    **Arguments:** `text`: the grammar; `start`: the start rule.

    **Returns:** a `GrammarSpec` whose rules refer only to rules.

    **Raises:** `GrammarError` (a `ValueError`) with lark's message (which names the line) for
    syntax errors and undefined names, and naming the feature for what we do not support:
    templates, `%declare`, regex flags other than `i` and `s`, a missing start rule.
    """
    if not isinstance(text, str):
        raise TypeError(f"a grammar must be a str, got {type(text).__name__}")
    # deferred on purpose: lark loads only when a grammar is parsed
    import lark
    from lark.load_grammar import GrammarBuilder

    builder = GrammarBuilder()
    try:
        builder.load_grammar(text, "<grammar>")
        builder.validate()
    except (lark.exceptions.LarkError, OSError) as e:
        message = " ".join(str(e).split())
        if isinstance(e, OSError):
            message = (
                f"cannot %import: {message} (only lark's own grammars, e.g. `%import common.NAME`)"
            )
        raise GrammarError(message) from None
    definitions = {str(name): d for name, d in builder._definitions.items()}
    common = _common_imports(text)
    resolved: dict[str, str] = {}

    def terminal_regex(name: str) -> str:
        if name not in resolved:
            if name in common:
                resolved[name] = common[name]
            else:
                d = definitions[name]
                if d.tree is None:
                    raise GrammarError(
                        f"terminal {name} is only declared (%declare is not supported)"
                    )
                resolved[name] = _regex_of(convert(d.tree, terminal=True))
        return resolved[name]

    def convert(tree, terminal: bool = False):
        # deferred on purpose: lark loads only when a grammar is parsed
        from lark import Tree
        from lark.grammar import NonTerminal, Terminal as LarkTerminal

        if isinstance(tree, NonTerminal):
            if definitions[tree.name].params:
                raise GrammarError(
                    f"rule {tree.name!r} is a template (templates are not supported)"
                )
            return Ref(tree.name)
        if isinstance(tree, LarkTerminal):
            return Terminal(terminal_regex(tree.name))
        if not isinstance(tree, Tree):
            raise GrammarError(f"unexpected item {tree!r}")
        kind, children = tree.data, tree.children
        if kind == "expansions":
            options = tuple(convert(c, terminal) for c in children)
            return options[0] if len(options) == 1 else Alt(options)
        if kind == "expansion":
            items = tuple(convert(c, terminal) for c in children)
            return items[0] if len(items) == 1 else Seq(items)
        if kind == "alias":
            return convert(children[0], terminal)
        if kind == "value":
            return convert(children[0], terminal)
        if kind == "maybe":
            return Repeat(convert(children[0], terminal), 0, 1)
        if kind == "expr":
            item = convert(children[0], terminal)
            op = children[1]
            if op == "?":
                return Repeat(item, 0, 1)
            if op in ("*", "+"):
                return Repeat(item, 0 if op == "*" else 1, None)
            low = int(children[2])
            high = int(children[3]) if len(children) > 3 else low
            if high < low:
                raise GrammarError(f"empty repetition ~ {low}..{high}")
            return Repeat(item, low, high)
        if kind == "literal":
            token = children[0]
            if token.type == "REGEXP":
                return Terminal(_regex_value(token))
            value, insensitive = _string_value(token)
            return Terminal(f"(?i:{escape(value)})" if insensitive else escape(value))
        if kind == "range":
            low, _ = _string_value(children[0])
            high, _ = _string_value(children[1])
            return Terminal(f"[{_class_char(low)}-{_class_char(high)}]")
        if kind == "template_usage":
            raise GrammarError(
                f"rule {children[0].name!r} is a template (templates are not supported)"
            )
        raise GrammarError(f"the grammar construct {kind!r} is not supported")

    rule_names = [n for n, d in definitions.items() if not d.is_term]
    if start not in rule_names:
        raise GrammarError(f"the start rule {start!r} is not defined (rules: {sorted(rule_names)})")
    rules = {}
    for name in rule_names:
        if definitions[name].params:
            continue  # a template: refused where it is used
        rules[name] = convert(definitions[name].tree)
    ignore = [terminal_regex(str(n)) for n in builder._ignore_names]
    _check_finite(rules, start)
    return GrammarSpec(rules=rules, ignore=ignore, start=start)


def _check_finite(rules: dict, start: str) -> None:
    """Refuse a grammar whose start rule derives no finite sentence (`start: "a" start`), as an
    empty regex is refused: the rules that can end are found by the textbook fixed point (a
    terminal ends; a sequence when all its items do, an alternative when one does, a repetition
    when it may repeat zero times or its item ends, a reference when its rule does).

    **Raises:** `GrammarError` naming the rules reachable from `start` that never end."""
    ends: set = set()

    def can_end(node) -> bool:
        if isinstance(node, Terminal):
            return True
        if isinstance(node, Ref):
            return node.name in ends
        if isinstance(node, Seq):
            return all(can_end(item) for item in node.items)
        if isinstance(node, Alt):
            return any(can_end(option) for option in node.options)
        if isinstance(node, Repeat):
            return node.low == 0 or can_end(node.item)
        return True

    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in ends and can_end(body):
                ends.add(name)
                changed = True
    if start in ends:
        return
    reached, work = [], [start]
    while work:
        name = work.pop()
        if name in reached or name in ends or name not in rules:
            continue
        reached.append(name)
        work.extend(_referenced(rules[name]))
    many = len(reached) > 1
    raise GrammarError(
        f"the grammar's language has no finite sentence: the rule{'s' if many else ''} "
        f"{', '.join(map(repr, reached))} never end{'' if many else 's'} (every derivation "
        "calls a rule again)"
    )


def _referenced(node) -> list[str]:
    """The rule names that `node` refers to, in order."""
    if isinstance(node, Ref):
        return [node.name]
    if isinstance(node, Seq):
        return [n for item in node.items for n in _referenced(item)]
    if isinstance(node, Alt):
        return [n for option in node.options for n in _referenced(option)]
    if isinstance(node, Repeat):
        return _referenced(node.item)
    return []


def _regex_of(node) -> str:
    """The regex of a terminal's expression (terminals only refer to terminals)."""
    if isinstance(node, Terminal):
        return node.regex
    if isinstance(node, Ref):
        raise GrammarError(f"a terminal cannot refer to the rule {node.name!r}")
    if isinstance(node, Seq):
        return "".join(f"(?:{_regex_of(i)})" for i in node.items)
    if isinstance(node, Alt):
        return "(?:" + "|".join(_regex_of(o) for o in node.options) + ")"
    if isinstance(node, Repeat):
        inner = f"(?:{_regex_of(node.item)})"
        if node.high is None:
            return inner + ("*" if node.low == 0 else "+" if node.low == 1 else f"{{{node.low},}}")
        return inner + ("?" if (node.low, node.high) == (0, 1) else f"{{{node.low},{node.high}}}")
    raise TypeError(node)


# --------------------------------------------------------------------------- GBNF


_BRACES = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")


def _item_start(text: str, end: int) -> int:
    """Where the grammar item that ends just before `end` starts (a group, string, regex or name)."""
    i = end - 1
    closer = text[i]
    if closer in ")]":
        opener, depth = "(" if closer == ")" else "[", 0
        while i >= 0:
            if text[i] == closer:
                depth += 1
            elif text[i] == opener:
                depth -= 1
                if depth == 0:
                    return i
            i -= 1
    if closer in '"/':
        i -= 1
        while i >= 0 and not (text[i] == closer and text[i - 1] != "\\"):
            i -= 1
        return i
    while i >= 0 and (text[i].isalnum() or text[i] == "_"):
        i -= 1
    return i + 1


def _plain_lark(text: str) -> str:
    """llguidance's Lark dialect -> lark's: no `%llguidance` header, `x{m,n}` -> `x ~ m..n`."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if text.startswith("%llguidance", i) and (i == 0 or text[i - 1] == "\n"):
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        if text.startswith("//", i):  # a comment, to the end of the line
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(text[i:j])
            i = j
            continue
        if ch in '"/':  # a string or regex literal, copied as is
            j = i + 1
            while j < n and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            j += 1
            while (j < n and text[j] in "imsux" and ch == "/") or (
                ch == '"' and j < n and text[j] == "i"
            ):
                j += 1
            out.append(text[i:j])
            i = j
            continue
        m = _BRACES.match(text, i) if ch == "{" else None
        if m:
            low, comma, high = int(m.group(1)), m.group(2), m.group(3)
            if not comma:
                out.append(f" ~ {low}")
            elif high:
                out.append(f" ~ {low}..{high}")
            else:  # x{m,}: x ~ m followed by x*
                joined = "".join(out)
                item = joined[_item_start(joined, len(joined)) :]
                out.append(f" ~ {low} {item}*" if low else "*")
                if not low:
                    out[-1] = "*"
            i = m.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def gbnf_to_lark(text: str) -> str:
    """Convert a llama.cpp GBNF grammar into lark's grammar syntax.

    The conversion is llguidance's (`llguidance.gbnf_to_lark`, start rule `root` -> `start`,
    character classes -> regexes, terminal-only rules -> terminals); its `%llguidance` header
    and `{m,n}` repetitions are then rewritten into plain Lark.

    **Raises:** `GrammarError` with llguidance's message (it names the line, or the undefined
    rule) for bad GBNF, llguidance's own exception kept as `__cause__`.
    """
    if not isinstance(text, str):
        raise TypeError(f"a GBNF grammar must be a str, got {type(text).__name__}")
    # deferred on purpose: llguidance (native) loads only for GBNF
    from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark as convert

    try:
        converted = convert(text)
    except (GbnfToLarkError, ValueError, KeyError, IndexError) as e:
        raise GrammarError(f"not a valid GBNF grammar: {e}") from e
    except Exception as e:  # llguidance raises a bare Exception, e.g. "Rule 'foo' not found"
        raise GrammarError(f"not a valid GBNF grammar: {e}") from e
    return _plain_lark(converted)
