"""Format regexes against the standard library's parsers (`datetime`, `uuid`, `ipaddress`)."""

import datetime
import ipaddress
import random
import re
import uuid

from functional_gen.structured.formats import DATE, DATE_TIME, EMAIL, IPV4, TIME, UUID


def test_date_accepts_exactly_the_valid_calendar_dates():
    pattern = re.compile(DATE)
    for year in (1, 4, 100, 200, 400, 1600, 1700, 1900, 2000, 2023, 2024, 9996, 9999):
        for month in range(14):
            for day in range(33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    datetime.date.fromisoformat(text)
                    valid = True
                except ValueError:
                    valid = False
                assert bool(pattern.fullmatch(text)) == valid, text
    assert not pattern.fullmatch("0000-01-01")


def test_time_and_date_time_parse_with_an_offset():
    rng = random.Random(0)
    time_re, dt_re = re.compile(TIME), re.compile(DATE_TIME)
    for _ in range(500):
        h, m, s = rng.randrange(30), rng.randrange(70), rng.randrange(70)
        frac = rng.choice(["", ".5", ".123456"])
        zone = rng.choice(["Z", "+05:30", "-11:00", ""])
        text = f"{h:02d}:{m:02d}:{s:02d}{frac}{zone}"
        valid = h < 24 and m < 60 and s < 60 and zone != ""
        assert bool(time_re.fullmatch(text)) == valid, text
        if valid:
            assert datetime.time.fromisoformat(text).tzinfo is not None
            assert datetime.datetime.fromisoformat("2024-02-29T" + text)
            assert dt_re.fullmatch("2024-02-29T" + text)


def test_uuid_email_ipv4():
    for _ in range(50):
        u = str(uuid.uuid4())
        assert re.fullmatch(UUID, u) and re.fullmatch(UUID, u.upper())
    assert not re.fullmatch(UUID, uuid.uuid4().hex)
    for ok in ("a@b.co", "first.last+tag@mail.example.org"):
        assert re.fullmatch(EMAIL, ok)
    for bad in ("a@b", "@b.co", "a..b@c.de", 'a"b@c.de', "a@b.c"):
        assert not re.fullmatch(EMAIL, bad)
    for text in ("0.0.0.0", "255.255.255.255", "192.168.1.10", "256.1.1.1", "01.2.3.4", "1.2.3"):
        try:
            ipaddress.IPv4Address(text)
            valid = True
        except ValueError:
            valid = False
        assert bool(re.fullmatch(IPV4, text)) == valid, text


def test_uri_template_matches_only_templates_the_reference_package_accepts():
    import uri_template  # what jsonschema's format checker uses for "uri-template"

    from functional_gen.structured.formats import URI_TEMPLATE

    pattern = re.compile(URI_TEMPLATE)
    accepted = ["", "http://example.com/{id}", "/a{/path*}{?q,lang:2}{&x}", "{+base}{#frag}"]
    accepted += ["{a.b,c_1:999}", "%41{.x}{;y*}", "http://h/[::1]/{x}"]
    refused = ["x{", "{", "}", "{}", "{=a}", "{a:0}", "{a:1000}", "{a b}", "{.a..b}", "a b"]
    for text in accepted:
        assert pattern.fullmatch(text) and uri_template.validate(text), text
    for text in refused:
        assert not pattern.fullmatch(text), text
    rng = random.Random(0)  # random templates built from the grammar's pieces
    pieces = ["a", "/", "?", "%2F", "{x}", "{+x,y}", "{#x:3}", "{/x*}", "{", "}", "{x:}", "{&x.y}"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(6)))
        if pattern.fullmatch(text):
            assert uri_template.validate(text), text


def test_uri_and_uri_reference_match_only_what_rfc3986_validator_accepts():
    """RFC 3986's grammar against `rfc3986_validator` (what `jsonschema` checks `uri` and
    `uri-reference` with), on random strings over the characters that decide the structure.
    MaskBench (JsonSchemaStore bounded-context.json) has `"entryPoint": "://"`, an invalid
    `uri-reference` that the old character-set regex accepted; `1a:b` reads as neither."""
    from rfc3986_validator import validate_rfc3986

    from functional_gen.structured.formats import URI, URI_REFERENCE

    rng = random.Random(0)
    pieces = [*"ab:/?#@%1f.-_~!$&'()*+,; ", "//", "::", "%2F", "%zz", "http://", ":80", "a@b"]
    accepted = {"URI": 0, "URI_reference": 0}
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(9)))
        for rule, regex in (("URI", URI), ("URI_reference", URI_REFERENCE)):
            valid = validate_rfc3986(text, rule=rule) is not None
            # the one form left out: IP-literal hosts ("[::1]"), none among these pieces
            assert bool(re.fullmatch(regex, text)) == valid, (rule, text)
            accepted[rule] += valid
    assert min(accepted.values()) > 500  # the comparison saw many valid strings too
    for text in ("://", "1a:b", ":", "a b", "http://a@b@c"):
        assert not re.fullmatch(URI_REFERENCE, text), text
    for text in ("Core", "../x/y", "//host:8080/p?q#f", "mailto:a@b.co", "urn:isbn:0451450523"):
        assert re.fullmatch(URI_REFERENCE, text) and validate_rfc3986(text, "URI_reference")
