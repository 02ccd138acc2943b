"""Writing regexes: `escape` (a regex matching a literal text) and `ascii_classes` (ECMA-262's
ASCII `\\d`, `\\w`). Text helpers with no imports, so that every module that writes regexes
(`grammar_syntax`, `choice`, `json_schema`, `regex`) can import them.
"""

_META = set("\\.+*?()|[]{}^$#&-~")


def escape(text: str) -> str:
    """A regex (Rust `regex` syntax, also valid for Python's `re`) matching exactly `text`."""
    out = []
    for ch in text:
        if ch in _META:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


_ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_"}


def ascii_classes(pattern: str) -> str:
    """`pattern` (Rust `regex` syntax) with `\\d`, `\\D`, `\\w`, `\\W` made ASCII, as in
    ECMA-262 (JavaScript) and in Python's `re.ASCII`: `\\d` is `[0-9]`, `\\w` is
    `[0-9A-Za-z_]`, inside character classes too. `\\s` and `\\b` are left as they are.

    Rust's `regex` (outlines-core's engine) reads them as Unicode classes: `\\d{3}` then also
    allows `٣` or `🯸` (U+1FBF8), and its automaton is about 10 times bigger.
    """
    out, i, depth = [], 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt.lower() in _ASCII_CLASSES:
                members = _ASCII_CLASSES[nxt.lower()]
                if nxt.islower():
                    out.append(members if depth else f"[{members}]")
                else:
                    out.append(f"[^{members}]")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if ch == "[":
            if depth and pattern.startswith("[:", i):  # an ASCII class like [:alpha:]
                end = pattern.find(":]", i + 2)
                if end != -1:
                    out.append(pattern[i : end + 2])
                    i = end + 2
                    continue
            depth += 1
            out.append(ch)
            i += 1
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):  # a leading ] is a literal
                out.append("]")
                i += 1
            continue
        if ch == "]" and depth:
            depth -= 1
        out.append(ch)
        i += 1
    return "".join(out)
