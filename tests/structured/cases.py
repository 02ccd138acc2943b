"""Real-world-shaped constraints for the structured-generation tests: JSON Schemas, regexes,
choices and grammars, each with a prompt for the default model."""

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class Movie(BaseModel):
    """A pydantic model: schema via `model_json_schema()` (with `$defs`, `anyOf` for Optional)."""

    title: str = Field(max_length=40)
    year: int = Field(ge=1900, le=2030)
    genres: list[Literal["drama", "comedy", "action", "documentary"]] = Field(max_length=3)
    rating: float | None = None


_PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}

SCHEMAS = {
    "person": (
        "a person with a name, an age and an email",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "email": {"type": "string", "format": "email"},
            },
            "required": ["name", "age", "email"],
        },
    ),
    "product": (
        "a product in an online shop",
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "name": {"type": "string", "maxLength": 40},
                "price": {"type": "number", "minimum": 0},
                "in_stock": {"type": "boolean"},
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 12},
                    "maxItems": 3,
                },
            },
            "required": ["id", "name", "price", "in_stock", "tags"],
        },
    ),
    "address": (
        "a postal address in North America",
        {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 40},
                "city": {"type": "string", "maxLength": 25},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"enum": ["US", "CA", "MX"]},
            },
            "required": ["street", "city", "zip", "country"],
        },
    ),
    "event": (
        "a meeting on a calendar",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "date": {"type": "string", "format": "date"},
                "start": {"type": "string", "format": "time"},
                "attendees": {"type": "integer", "minimum": 1, "maximum": 500},
            },
            "required": ["title", "date", "start", "attendees"],
        },
    ),
    "weather": (
        "the weather in a city today",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 25},
                "temperature": {"type": "number", "minimum": -50, "maximum": 60},
                "conditions": {"enum": ["sunny", "cloudy", "rain", "snow", "storm"]},
                "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["city", "temperature", "conditions", "humidity"],
        },
    ),
    "book": (
        "a famous book",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 50},
                "author": {
                    "type": "object",
                    "properties": {
                        "first": {"type": "string", "maxLength": 20},
                        "last": {"type": "string", "maxLength": 20},
                    },
                    "required": ["first", "last"],
                },
                "year": {"type": "integer", "minimum": 1450, "maximum": 2025},
                "isbn": {"type": "string", "pattern": "^97[89][0-9]{10}$"},
            },
            "required": ["title", "author", "year", "isbn"],
        },
    ),
    "order": (
        "an order with a few items",
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "integer", "minimum": 1},
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                        },
                        "required": ["sku", "quantity"],
                    },
                    "minItems": 1,
                    "maxItems": 3,
                },
                "total": {"type": "number", "minimum": 0},
            },
            "required": ["order_id", "items", "total"],
        },
    ),
    "user_profile": (
        "a user profile; the bio and the verified flag are optional",
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "pattern": "^[a-z0-9_]{3,16}$"},
                "bio": {"type": "string", "maxLength": 60},
                "verified": {"type": "boolean"},
            },
            "required": ["username"],
        },
    ),
    "coordinates": (
        "the coordinates of Paris",
        {
            "type": "object",
            "properties": {
                "lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"type": "number", "minimum": -180, "maximum": 180},
            },
            "required": ["lat", "lon"],
        },
    ),
    "color": (
        "a color with its hex code",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "hex": {"type": "string", "pattern": "^#[0-9a-fA-F]{6}$"},
            },
            "required": ["name", "hex"],
        },
    ),
    "sentiment": (
        "the sentiment of 'I love this phone!'",
        {
            "type": "object",
            "properties": {
                "label": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["label", "confidence"],
        },
    ),
    "unicode": (
        "a greeting in Spanish and a word in Japanese",
        {
            "type": "object",
            "properties": {
                "greeting": {"const": "¡Hola, señor! 👋"},
                "word": {"enum": ["café", "naïve", "日本語", "Ελληνικά"]},
                "note": {"type": "string", "maxLength": 20},
            },
            "required": ["greeting", "word", "note"],
        },
    ),
    "log_entry": (
        "a log line from a web server",
        {
            "type": "object",
            "properties": {
                "timestamp": {"type": "string", "format": "date-time"},
                "level": {"enum": ["DEBUG", "INFO", "WARN", "ERROR"]},
                "message": {"type": "string", "maxLength": 50},
            },
            "required": ["timestamp", "level", "message"],
        },
    ),
    "http_request": (
        "an HTTP request to an API",
        {
            "type": "object",
            "properties": {
                "method": {"enum": ["GET", "POST", "PUT", "DELETE"]},
                "url": {"type": "string", "pattern": "^https://[a-z]+\\.[a-z]{2,3}(/[a-z]+)?$"},
                "headers": {
                    "type": "object",
                    "properties": {"content_type": {"const": "application/json"}},
                    "required": ["content_type"],
                },
            },
            "required": ["method", "url", "headers"],
        },
    ),
    "matrix": (
        "a 2x2 matrix of integers",
        {
            "type": "array",
            "items": {
                "type": "array",
                "items": {"type": "integer", "minimum": -99, "maximum": 99},
                "minItems": 2,
                "maxItems": 2,
            },
            "minItems": 2,
            "maxItems": 2,
        },
    ),
    "nullable": (
        "a counter whose value may be unknown",
        {
            "type": "object",
            "properties": {"value": {"type": ["integer", "null"], "minimum": 0, "maximum": 1000}},
            "required": ["value"],
        },
    ),
    "payment": (
        "a payment method, a card or a bank account",
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"card": {"type": "string", "pattern": "^[0-9]{16}$"}},
                    "required": ["card"],
                },
                {
                    "type": "object",
                    "properties": {
                        "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{8,16}$"}
                    },
                    "required": ["iban"],
                },
            ]
        },
    ),
    "shape": (
        "a geometric shape",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "circle"},
                        "radius": {"type": "number", "minimum": 0, "maximum": 100},
                    },
                    "required": ["kind", "radius"],
                },
                {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "square"},
                        "side": {"type": "number", "minimum": 0, "maximum": 100},
                    },
                    "required": ["kind", "side"],
                },
            ]
        },
    ),
    "all_of": (
        "an employee: a person with a job title",
        {
            "allOf": [
                _PERSON,
                {
                    "type": "object",
                    "properties": {"title": {"type": "string", "maxLength": 30}},
                    "required": ["title"],
                },
            ]
        },
    ),
    "team": (
        "a small team with a lead and members",
        {
            "$defs": {"person": _PERSON},
            "type": "object",
            "properties": {
                "lead": {"$ref": "#/$defs/person"},
                "members": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 2},
            },
            "required": ["lead", "members"],
        },
    ),
    "tree": (
        "a small tree of numbers",
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "value": {"type": "integer", "minimum": 0, "maximum": 9},
                        "children": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/node"},
                            "maxItems": 2,
                        },
                    },
                    "required": ["value", "children"],
                }
            },
            "$ref": "#/$defs/node",
        },
    ),
    "movie": ("a movie", Movie),
    "priority": ("the priority of a task, a Fibonacci number", {"enum": [1, 2, 3, 5, 8]}),
    "flags": (
        "three feature flags",
        {
            "type": "object",
            "properties": {
                "dark_mode": {"type": "boolean"},
                "beta": {"type": "boolean"},
                "notifications": {"type": "boolean"},
            },
            "required": ["dark_mode", "beta", "notifications"],
            "additionalProperties": False,
        },
    ),
    "fruits": (
        "a list of fruits",
        {
            "type": "array",
            "items": {"type": "string", "maxLength": 10},
            "minItems": 2,
            "maxItems": 4,
        },
    ),
    "uuid": ("a random UUID", {"type": "string", "format": "uuid"}),
    "integer": (
        "a temperature in Kelvin between -1000 and 1000",
        {"type": "integer", "minimum": -1000, "maximum": 1000},
    ),
    "network": (
        "a network service",
        {
            "type": "object",
            "properties": {
                "ip": {"type": "string", "format": "ipv4"},
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "protocol": {"enum": ["tcp", "udp"]},
            },
            "required": ["ip", "port", "protocol"],
        },
    ),
    "recipe": (
        "a pancake recipe",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                "ingredients": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "item": {"type": "string", "maxLength": 20},
                            "amount": {"type": "number", "minimum": 0},
                            "unit": {"enum": ["g", "ml", "cup", "tbsp"]},
                        },
                        "required": ["item", "amount", "unit"],
                    },
                    "maxItems": 2,
                },
            },
            "required": ["name", "servings", "ingredients"],
        },
    ),
    "calendar_day": (
        "a public holiday",
        {
            "type": "object",
            "properties": {
                "month": {"type": "integer", "minimum": 1, "maximum": 12},
                "day": {"type": "integer", "minimum": 1, "maximum": 31},
                "holiday": {"type": "boolean"},
            },
            "required": ["month", "day", "holiday"],
        },
    ),
    "api_response": (
        "a successful API response",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "status": {"const": "ok"},
                    "data": {
                        "type": "object",
                        "properties": {
                            "count": {"type": "integer", "minimum": 0},
                            "items": {
                                "type": "array",
                                "items": {"type": "string", "maxLength": 15},
                                "maxItems": 2,
                            },
                        },
                        "required": ["count", "items"],
                    },
                    "error": {"type": "null"},
                },
                "required": ["status", "data", "error"],
            }
        ),
    ),
    "tuple": (
        "a row: a name, an age and whether they are a student",
        {
            "type": "array",
            "prefixItems": [
                {"type": "string", "maxLength": 15},
                {"type": "integer", "minimum": 0, "maximum": 99},
                {"type": "boolean"},
            ],
            "items": False,
        },
    ),
    "score": (
        "a score strictly between 0 and 10",
        {
            "type": "object",
            "properties": {
                "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10}
            },
            "required": ["score"],
        },
    ),
}

REGEXES = {
    "date": ("Today's date", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    "phone": ("A US phone number", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    "email": ("The email of a support team", r"[a-z0-9._]+@[a-z0-9]+\.(com|org|net)"),
    "ipv4": (
        "The IP address of a home router",
        r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    ),
    "hex_color": ("The hex code of the color red", r"#[0-9a-fA-F]{6}"),
    "zip": ("A US zip code", r"[0-9]{5}(-[0-9]{4})?"),
    "time": ("The time of lunch", r"([01][0-9]|2[0-3]):[0-5][0-9]"),
    "semver": ("The version of a library", r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"),
    "url": ("The URL of a search engine", r"https://(www\.)?[a-z]+\.(com|org|io)(/[a-z]+){0,2}"),
    "uuid4": (
        "A version-4 UUID",
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
    ),
    "price": ("The price of a car in dollars", r"\$[0-9]{1,3}(,[0-9]{3})*\.[0-9]{2}"),
    "answer": ("Is the sky blue? Answer and explain", r"(Yes|No), because [a-z ]{5,40}\."),
    "full_name": ("The name of a famous scientist", r"[A-Z][a-z]+ [A-Z][a-z]+"),
    "unicode": (
        "A French or Japanese word",
        r"(café|naïve|résumé|日本語|Ελληνικά)( [a-zé]{1,10})?",
    ),
    "csv": ("Three fruits, comma separated", r"[a-z]+(,[a-z]+){2}"),
    "temperature": ("The temperature outside", r"-?[0-9]{1,2}(\.[0-9])? ?°[CF]"),
    "qa": ("A question and its answer", r"Q: [A-Za-z ?]{5,30}\nA: [A-Za-z ]{1,30}"),
}

CHOICES = {
    "sentiment": (
        "Is 'I hate waiting' positive, negative or neutral?",
        ["positive", "negative", "neutral"],
    ),
    "capital": ("What is the capital of France?", ["Paris", "London", "Berlin", "Paris, France"]),
    "unicode": ("Say thank you", ["merci", "danke", "ありがとう", "спасибо"]),
}

ARITHMETIC = r"""
start: expr
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | "(" expr ")" | "-" factor
NUMBER: /[0-9]+(\.[0-9]+)?/
%import common.WS_INLINE
%ignore WS_INLINE
"""

JSON_GRAMMAR = r"""
?start: value
?value: object
      | array
      | string
      | SIGNED_NUMBER      -> number
      | "true"             -> true
      | "false"            -> false
      | "null"             -> null
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""

SEXPR = r"""
start: sexpr
sexpr: "(" ATOM (" " (ATOM | sexpr))* ")"
ATOM: /[a-z][a-z0-9]*/ | /[0-9]+/
"""

GRAMMARS = {
    "arithmetic": ("Write an arithmetic expression with parentheses", ARITHMETIC, 3),
    "json": ("Write a JSON object about a cat", JSON_GRAMMAR, 3),
    "sexpr": ("Write a Lisp expression", SEXPR, 3),
}

SQL = r"""
start: select
select: "SELECT " columns " FROM " NAME [" WHERE " condition]
columns: "*" | NAME (", " NAME)*
condition: comparison ((" AND " | " OR ") comparison)*
comparison: NAME OP value | "(" condition ")" | "NOT " comparison
OP: "=" | "<" | ">"
value: NUMBER | STRING | "(" select ")"
NAME: /[a-z_]+/
NUMBER: /[0-9]+/
STRING: /'[^']*'/
"""

LISP = r"""
start: sexpr
sexpr: atom | list | "'" sexpr
list: "(" [sexpr (" " sexpr)*] ")"
atom: SYMBOL | NUMBER
SYMBOL: /[a-z+*\/<>=-][a-z0-9+*\/<>=-]*/
NUMBER: /[0-9]+/
"""

FUNCTION_CALLS = r"""
start: call
call: NAME "(" [arg ("," " "? arg)*] ")"
?arg: call | NAME | NAME "=" arg | NUMBER | STRING | "[" [arg ("," " "? arg)*] "]"
NAME: /[a-z_][a-z0-9_]*/
NUMBER: /-?[0-9]+/
STRING: /"[^"]*"/
"""

SPACED_FUNCTION_CALLS = r"""
start: call
call: NAME "(" [arg ("," arg)*] ")"
?arg: call | NAME | NUMBER | "[" [arg ("," arg)*] "]"
NAME: /[a-z_][a-z0-9_]*/
NUMBER: /-?[0-9]+/
%ignore " "
"""
"""Not deterministic byte by byte: after `f (x ` the space may precede `(` (a call `x (...)`)
or `)` (the end of `f`'s arguments)."""

PUSHDOWN_GRAMMARS = {
    "json": JSON_GRAMMAR,
    "arithmetic": ARITHMETIC,
    "sql": SQL,
    "lisp": LISP,
    "function_calls": FUNCTION_CALLS,
}
"""Five recursive grammars the pushdown automaton runs (compared with lark's parser)."""

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"""
"""llama.cpp's `grammars/json.gbnf` (comments dropped)."""

C_GBNF = Path(__file__).parent / "data" / "c.gbnf"
"""llama.cpp's `grammars/c.gbnf` (MIT licence), unchanged: one byte of lookahead cannot decide
it (run with parallel stacks, `structured.pushdown.parallel`)."""
