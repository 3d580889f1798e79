#!/usr/bin/env python3
"""Checks a number in a tool's output against a bound.

  expect.py FILE REGEX OP VALUE     (OP: lt, le, gt, ge)

REGEX's first group is the number; the last match in FILE counts. Prints the
comparison; exits 1 when it does not hold or nothing matches.
"""
import operator
import re
import sys

OPS = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}


def main():
    path, regex, op, bound = sys.argv[1:5]
    matches = re.findall(regex, open(path).read())
    if not matches:
        print(f"FAIL: no match for {regex!r} in {path}")
        return 1
    value = float(matches[-1] if isinstance(matches[-1], str) else matches[-1][0])
    ok = OPS[op](value, float(bound))
    print(f"{'PASS' if ok else 'FAIL'}: {value} {op} {bound}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
