#!/usr/bin/env python3
"""validate.py FILE: check the samples tests/test_schema.c drew from compiled JSON Schemas.

FILE holds one JSON object a line: {"name", "schema", "samples": [text, ...], "accept": [text,
...]}.  Every sample and every hand-written "accept" instance must parse as JSON (json.loads,
no NaN / Infinity) and be valid under the schema for the reference validator: python-jsonschema,
Draft 2020-12, with that draft's FormatChecker (formats are asserted).  Prints one line a schema, "ok NAME
(N checked)" or "bad NAME: why", and exits 0; exits 3 with one "bad" line when jsonschema is
missing.  The lines do not start with PASS/FAIL: test_schema.c reads them and reports.

Two things the reference validator lacks are supplied here: OpenAPI's "nullable" (which
schema.c accepts) becomes anyOf [schema, {"type": "null"}], and when rfc3339-validator is not
installed (jsonschema then skips "date-time" and "time") those two formats are checked by the
same RFC 3339 rule that package applies.  We rejected a validator of our own: the point is an
independent reading of the schema.
"""
import calendar
import json
import re
import sys

try:
    import jsonschema
    from jsonschema import Draft202012Validator, FormatChecker
except ImportError:
    print("bad *: python module jsonschema missing (make test installs tools/py-requirements.txt into build/venv)")
    sys.exit(3)

RFC3339 = re.compile(r"(\d{4})-(0[1-9]|1[0-2])-(\d{2})T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?"
                     r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)", re.ASCII)


def rfc3339(text):
    m = RFC3339.fullmatch(text.upper())
    if not m:
        return False
    year, month, day = map(int, m.groups())
    return year > 0 and 1 <= day <= calendar.monthrange(year, month)[1]


def format_checker():
    # Draft 2020-12's own formats: a plain FormatChecker() mixes in every draft's, and draft 3's
    # "time" (HH:MM:SS, no offset) overrides RFC 3339's full-time there
    fc = FormatChecker(formats=())
    fc.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
    if "date-time" not in fc.checkers:
        fc.checks("date-time")(lambda s: not isinstance(s, str) or rfc3339(s))
        fc.checks("time")(lambda s: not isinstance(s, str) or rfc3339("1970-01-01T" + s))
    return fc


SUB_MAPS = ("properties", "$defs", "definitions")      # keywords whose values are {name: schema}
SUB_ONE = ("items", "additionalProperties")            # keywords whose value is a schema
SUB_LIST = ("prefixItems", "anyOf", "oneOf", "allOf")   # keywords whose value is [schema, ...]


def denull(s):
    """OpenAPI nullable: true -> anyOf [s without it, null], in schema positions only (not in
    enum / const values); $defs stay where their $refs find them."""
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k in SUB_MAPS and isinstance(v, dict):
            v = {name: denull(x) for name, x in v.items()}
        elif k in SUB_ONE:
            v = denull(v)
        elif k in SUB_LIST and isinstance(v, list):
            v = [denull(x) for x in v]
        if k != "nullable":
            out[k] = v
    if s.get("nullable") is not True:
        return out
    keep = {k: out.pop(k) for k in ("$defs", "definitions") if k in out}
    keep["anyOf"] = [out, {"type": "null"}]
    return keep


def no_constant(name):
    raise ValueError("not JSON: " + name)


def check(entry, fc):
    schema = denull(entry["schema"])
    Draft202012Validator.check_schema(schema)
    v = Draft202012Validator(schema, format_checker=fc)
    texts = [("sample", t) for t in entry.get("samples", [])] + [("accept", t) for t in entry.get("accept", [])]
    for i, (kind, text) in enumerate(texts):
        try:
            inst = json.loads(text, parse_constant=no_constant)
        except ValueError as e:
            return "%s %d does not parse (%s): %r" % (kind, i, e, text[:200])
        errs = sorted(v.iter_errors(inst), key=lambda e: list(e.path))
        if errs:
            return "%s %d invalid (%s at %s): %r" % (kind, i, errs[0].message[:200], list(errs[0].path), text[:300])
    return None, len(texts)


def main():
    fc = format_checker()
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            try:
                r = check(entry, fc)
            except jsonschema.SchemaError as e:
                r = "the schema is not valid Draft 2020-12: " + e.message[:200]
            if isinstance(r, tuple):
                print("ok %s (%d checked)" % (entry["name"], r[1]))
            else:
                print("bad %s: %s" % (entry["name"], r))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
