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

Expressions: sequences, `a | b`, `(...)`, `[...]` and `x?` (optional), `x*`, `x+`, `x ~ n`,
`x ~ n..m`, string literals `"..."` (`"..."i` case-insensitive), character ranges `"a".."z"`,
regexes `/.../` (flags `i`, `s`; Rust `regex` syntax, the common subset of Python's), aliases
`-> name` (ignored: they shape trees, not the language), priorities `rule.2:` (ignored).
Not supported: templates, `%declare`, `%override`, `%extend`, imports other than `common`.

Source: Lark's grammar reference ("Grammar Reference", lark-parser.readthedocs.io) and its
`grammars/common.lark`.
"""

import ast
import dataclasses
import re

from .regex import escape

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


# --------------------------------------------------------------------------- lexer

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t]+) |
    (?P<comment>//[^\n]*) |
    (?P<string>"(?:[^"\\\n]|\\.)*"i?) |
    (?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*) |
    (?P<arrow>->) |
    (?P<range>\.\.) |
    (?P<name>[?!]?[_A-Za-z][_A-Za-z0-9]*(?:\.[_A-Za-z][_A-Za-z0-9]*)*) |
    (?P<number>[0-9]+) |
    (?P<op>[:|()\[\]?*+~.,%-]) |
    (?P<bad>.)
    """,
    re.VERBOSE,
)


def _lex(line: str, lineno: int):
    tokens = []
    for m in _TOKEN.finditer(line):
        kind = m.lastgroup
        if kind in ("ws", "comment"):
            continue
        if kind == "bad":
            raise GrammarError(f"line {lineno}: unexpected character {m.group()!r} in {line.strip()!r}")
        tokens.append((kind, m.group()))
    return tokens


def _string_value(token: str, lineno: int) -> tuple[str, bool]:
    insensitive = token.endswith("i")
    body = token[:-1] if insensitive else token
    try:
        value = ast.literal_eval(body)
    except (ValueError, SyntaxError) as e:
        raise GrammarError(f"line {lineno}: bad string literal {token}: {e}") from None
    return value, insensitive


def _regex_value(token: str, lineno: int) -> str:
    end = token.rindex("/")
    body, flags = token[1:end].replace("\\/", "/"), token[end + 1 :]
    unsupported = set(flags) - {"i", "s"}
    if unsupported:
        raise GrammarError(f"line {lineno}: regex flags {sorted(unsupported)} are not supported in {token}")
    return f"(?{flags}:{body})" if flags else f"(?:{body})"


# --------------------------------------------------------------------------- parser


class _Parser:
    def __init__(self, tokens, lineno: int, source: str):
        self.tokens, self.pos, self.lineno, self.source = tokens, 0, lineno, source

    def error(self, message: str):
        raise GrammarError(f"line {self.lineno}: {message} in {self.source.strip()!r}")

    def peek(self, offset=0):
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else (None, None)

    def take(self, value=None):
        kind, text = self.peek()
        if kind is None or (value is not None and text != value):
            self.error(f"expected {value!r}" if value else "unexpected end")
        self.pos += 1
        return kind, text

    def expansions(self):
        options = [self.alias()]
        while self.peek()[1] == "|":
            self.take("|")
            options.append(self.alias())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def alias(self):
        expansion = self.expansion()
        if self.peek()[0] == "arrow":
            self.take()
            kind, _ = self.take()
            if kind != "name":
                self.error("expected a name after ->")
        return expansion

    def expansion(self):
        items = []
        while self.peek()[1] not in (None, "|", ")", "]") and self.peek()[0] != "arrow":
            items.append(self.expr())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def expr(self):
        atom = self.atom()
        kind, text = self.peek()
        if text in ("?", "*", "+") and kind == "op":
            self.take()
            return Repeat(atom, 0 if text != "+" else 1, 1 if text == "?" else None)
        if text == "~":
            self.take()
            _, low = self.take()
            if not low.isdigit():
                self.error(f"expected a count after ~, got {low!r}")
            high = low
            if self.peek()[0] == "range":
                self.take()
                _, high = self.take()
                if not high.isdigit():
                    self.error(f"expected a count after .., got {high!r}")
            if int(high) < int(low):
                self.error(f"empty repetition ~ {low}..{high}")
            return Repeat(atom, int(low), int(high))
        return atom

    def atom(self):
        kind, text = self.take()
        if text == "(":
            inner = self.expansions()
            self.take(")")
            return inner
        if text == "[":
            inner = self.expansions()
            self.take("]")
            return Repeat(inner, 0, 1)
        if kind == "string":
            value, insensitive = _string_value(text, self.lineno)
            if self.peek()[0] == "range":
                self.take()
                kind2, text2 = self.take()
                if kind2 != "string":
                    self.error("expected a string after ..")
                end, _ = _string_value(text2, self.lineno)
                if len(value) != 1 or len(end) != 1 or end < value:
                    self.error(f"bad character range {text}..{text2}")
                return Terminal(f"[{escape(value)}-{escape(end)}]")
            if not value:
                return Seq(())
            return Terminal(f"(?i:{escape(value)})" if insensitive else escape(value))
        if kind == "regex":
            return Terminal(_regex_value(text, self.lineno))
        if kind == "name":
            if text[0] in "?!":
                self.error(f"unexpected {text!r}")
            return Ref(text)
        self.error(f"unexpected {text!r}")


def _logical_lines(text: str):
    """(line number, tokens) of each definition or directive, joining continuation lines
    (starting with `|`) and lines inside open brackets."""
    out, depth = [], 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        tokens = _lex(raw, lineno)
        if not tokens:
            continue
        if out and (depth > 0 or tokens[0][1] == "|"):
            out[-1] = (out[-1][0], out[-1][1] + " " + raw.strip(), out[-1][2] + tokens)
        else:
            out.append((lineno, raw.strip(), tokens))
        for kind, tok in tokens:
            if kind == "op" and tok in "([":
                depth += 1
            elif kind == "op" and tok in ")]":
                depth -= 1
    return out


def parse_grammar(text: str, start: str = "start") -> GrammarSpec:
    """Parse a Lark-style grammar (see the module docstring).

    **Arguments:** `text`: the grammar; `start`: the start rule.

    **Returns:** a `GrammarSpec` whose rules refer only to rules (terminals are inlined as
    regexes).

    **Raises:** `GrammarError` (a `ValueError`) naming the line for syntax errors, unsupported
    directives, undefined or recursive terminals, undefined rules or a missing start rule.
    """
    if not isinstance(text, str):
        raise TypeError(f"a grammar must be a str, got {type(text).__name__}")
    rules: dict[str, object] = {}
    terminals: dict[str, object] = {}
    ignore_names: list = []
    for lineno, line, tokens in _logical_lines(text):
        if tokens[0][1] == "%":
            directive = tokens[1][1] if len(tokens) > 1 else ""
            if directive == "import":
                _import(tokens[2:], terminals, lineno, line)
            elif directive == "ignore":
                parser = _Parser(tokens[2:], lineno, line)
                ignore_names.append(parser.expansions())
                if parser.pos != len(parser.tokens):
                    parser.error("unexpected text after %ignore")
            else:
                raise GrammarError(f"line {lineno}: the directive %{directive} is not supported")
            continue
        kind, name = tokens[0]
        if kind != "name":
            raise GrammarError(f"line {lineno}: expected a rule or terminal definition, got {line!r}")
        rest = tokens[1:]
        if rest and rest[0][1] == "." and len(rest) > 1 and rest[1][0] == "number":
            rest = rest[2:]  # priority
        elif "." in name:  # the lexer glued `name.2`
            name = name.split(".")[0]
        if not rest or rest[0][1] != ":":
            raise GrammarError(f"line {lineno}: expected ':' after {name!r} in {line!r}")
        name = name.lstrip("?!")
        parser = _Parser(rest[1:], lineno, line)
        body = parser.expansions()
        if parser.pos != len(parser.tokens):
            parser.error(f"unexpected {parser.peek()[1]!r}")
        target = terminals if name.lstrip("_")[:1].isupper() else rules
        if name in target:
            raise GrammarError(f"line {lineno}: {name!r} is defined twice")
        target[name] = body

    resolved: dict[str, str] = {}

    def terminal_regex(name: str, trail: tuple) -> str:
        if name in resolved:
            return resolved[name]
        if name in trail:
            raise GrammarError(f"terminal {name} is recursive ({' -> '.join(trail + (name,))}); use a rule")
        if name not in terminals:
            raise GrammarError(f"terminal {name} is not defined (import it with `%import common.{name}`?)")
        regex = _regex_of(terminals[name], lambda n: terminal_regex(n, trail + (name,)))
        resolved[name] = regex
        return regex

    def inline_terminals(node):
        if isinstance(node, Ref) and node.name.lstrip("_")[:1].isupper():
            return Terminal(terminal_regex(node.name, ()))
        if isinstance(node, Ref):
            if node.name not in rules:
                raise GrammarError(f"rule {node.name!r} is not defined")
            return node
        if isinstance(node, Seq):
            return Seq(tuple(inline_terminals(i) for i in node.items))
        if isinstance(node, Alt):
            return Alt(tuple(inline_terminals(o) for o in node.options))
        if isinstance(node, Repeat):
            return Repeat(inline_terminals(node.item), node.low, node.high)
        return node

    if start not in rules:
        raise GrammarError(f"the start rule {start!r} is not defined (rules: {sorted(rules)})")
    rules = {name: inline_terminals(body) for name, body in rules.items()}
    ignore = []
    for item in ignore_names:
        node = inline_terminals(item)
        if not isinstance(node, Terminal):
            raise GrammarError("%ignore takes terminals, not rules")
        ignore.append(node.regex)
    return GrammarSpec(rules=rules, ignore=ignore, start=start)


def _regex_of(node, terminal_regex) -> str:
    """The regex of a terminal's expression (terminals only refer to terminals)."""
    if isinstance(node, Terminal):
        return node.regex
    if isinstance(node, Ref):
        if not node.name.lstrip("_")[:1].isupper():
            raise GrammarError(f"a terminal cannot refer to the rule {node.name!r}")
        return f"(?:{terminal_regex(node.name)})"
    if isinstance(node, Seq):
        return "".join(f"(?:{_regex_of(i, terminal_regex)})" for i in node.items)
    if isinstance(node, Alt):
        return "(?:" + "|".join(_regex_of(o, terminal_regex) for o in node.options) + ")"
    if isinstance(node, Repeat):
        inner = f"(?:{_regex_of(node.item, terminal_regex)})"
        if node.high is None:
            return inner + ("*" if node.low == 0 else "+" if node.low == 1 else f"{{{node.low},}}")
        return inner + ("?" if (node.low, node.high) == (0, 1) else f"{{{node.low},{node.high}}}")
    raise TypeError(node)


def _import(tokens, terminals: dict, lineno: int, line: str) -> None:
    names = [t[1] for t in tokens if t[0] == "name"]
    if not names or not names[0].startswith("common"):
        raise GrammarError(f"line {lineno}: only `%import common.NAME` is supported, got {line!r}")
    if names[0] == "common":  # %import common (A, B)
        imported = [(n, n) for n in names[1:]]
    else:
        target = names[0].split(".", 1)[1]
        alias = names[1] if len(names) > 1 and any(t[0] == "arrow" for t in tokens) else target
        imported = [(target, alias)]
    for target, alias in imported:
        if target not in COMMON_TERMINALS:
            raise GrammarError(
                f"line {lineno}: common.{target} is not available; available: {sorted(COMMON_TERMINALS)}"
            )
        terminals[alias] = Terminal(COMMON_TERMINALS[target])
