#!/usr/bin/env python3
"""Checks a precision report (JSON) against the program it describes.

  count_casts.py PROGRAM.mlir REPORT.json

PROGRAM is kilnc --emit=train output. Every kiln.cast of @forward with a
kiln.precision.rule must be one of the report's casts (same rule, same
from and to element types, in order), and every one without a rule one of
its user casts. Exits 1 on any difference.
"""
import json
import re
import sys


def forward_casts(path):
    text = open(path).read()
    start = text.index("func.func @forward(")
    end = text.index("\n  }", start)
    casts = []
    pat = re.compile(r"kiln\.cast %\S+(?: \{([^}]*)\})? : tensor<[0-9x]*x?(\w+)> -> tensor<[0-9x]*x?(\w+)>")
    for m in pat.finditer(text[start:end]):
        attrs, src, dst = m.groups()
        rule = re.search(r'kiln\.precision\.rule = "([^"]+)"', attrs or "")
        casts.append((rule.group(1) if rule else None, src, dst))
    return casts


def main():
    program, report = sys.argv[1], sys.argv[2]
    got = forward_casts(program)
    r = json.load(open(report))
    want = [(c["rule"], re.match(r"\w+", c["from"]).group(0), c["to"]) for c in r["casts"]]
    user = [(None, re.match(r"\w+", c["from"]).group(0), c["to"]) for c in r["user_casts"]]
    ruled = [c for c in got if c[0] is not None]
    plain = [c for c in got if c[0] is None]
    ok = ruled == want and plain == user
    print(f"{'PASS' if ok else 'FAIL'}: @forward has {len(ruled)} rule casts and {len(plain)} "
          f"user casts; the report lists {len(want)} and {len(user)}")
    if not ok:
        for i, (a, b) in enumerate(zip(ruled, want)):
            if a != b:
                print(f"  first difference at cast {i}: program {a}, report {b}")
                break
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
