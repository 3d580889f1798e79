#!/usr/bin/env python3
"""Regenerates the CHECK lines of the split-file error tests from kilnc.

  python3 test/frontend/Inputs/update_error_checks.py [--kilnc PATH] FILE...

Each FILE (e.g. test/frontend/errors-names.kiln) holds sections

  #--- NAME.kiln
  # description
  # RUN: not kilnc %t/NAME.kiln [FLAGS] 2>&1 | FileCheck ... --check-prefix=PREFIX
  # PREFIX: ...          <- replaced
  # PREFIX-NEXT: ...     <- replaced
  model ...

For each section the model (with its comment lines, which shift the line
numbers) is compiled and the CHECK lines are rewritten to match kilnc's
output exactly: the error line, the echoed source line and the caret line.
Everything before the first section is left alone. Review the diff: the
expected output should be what a user ought to see, not just what kilnc
prints today.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile


def escape(text):
    """Makes literal text safe for a FileCheck pattern."""
    out = text.replace("{{", "\0A").replace("[[", "\0B")
    out = out.replace("\0A", r"{{\{\{}}").replace("\0B", r"{{\[\[}}")
    if out.endswith("{") and not out.endswith("{{"):
        out = out[:-1] + "{{[{]}}"  # keep a trailing '{' away from '{{$}}'
    return out


def checks(prefix, name, stderr, path):
    lines = stderr.rstrip("\n").split("\n")
    out = []
    for i, line in enumerate(lines):
        if line.startswith(path):
            body = "{{^.*}}/" + name + escape(line[len(path):]) + "{{$}}"
        elif line.startswith(" "):
            body = "{{^}}" + escape(line) + "{{$}}"
        else:
            body = escape(line) + "{{$}}"
        out.append("# %s%s: %s" % (prefix, "" if i == 0 else "-NEXT", body))
    return out


def update_section(kilnc, name, lines, trailing, tmp):
    run_re = re.compile(r"^# RUN: .*%t/" + re.escape(name) +
                        r"(?P<flags>[^|]*?)(?: 2>&1)?\)? \|.*--check-prefix=(?P<prefix>[\w-]+)")
    run_idx = next((i for i, l in enumerate(lines) if run_re.match(l)), None)
    if run_idx is None:
        return lines, None  # not a generated case
    m = run_re.match(lines[run_idx])
    prefix = m.group("prefix")
    flags = [f for f in shlex.split(m.group("flags")) if f != "2>&1"]
    flags = [f for f in flags if f not in ("(ulimit", "-t") and not f.endswith(";")]
    head = lines[:run_idx + 1]
    body = [l for l in lines[run_idx + 1:]
            if not re.match(r"^# %s(-NEXT)?:" % re.escape(prefix), l)]
    chk = []
    path = os.path.join(tmp, name)
    for _ in range(5):
        text = "\n".join(head + chk + body) + trailing
        with open(path, "w") as f:
            f.write(text)
        p = subprocess.run([kilnc, path] + flags, capture_output=True,
                           text=True, errors="replace", timeout=60)
        new = checks(prefix, name, p.stderr, path)
        if new == chk:
            break
        chk = new
    problem = None
    if p.returncode != 1 or "internal error" in p.stderr:
        problem = "%s: exit status %d\n%s" % (name, p.returncode, p.stderr[:1000])
    return head + chk + body, problem


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kilnc", default=os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "build", "bin", "kilnc"))
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for fname in args.files:
            text = open(fname).read()
            parts = re.split(r"^(#--- \S+\n)", text, flags=re.M)
            out = [parts[0]]
            for marker, section in zip(parts[1::2], parts[2::2]):
                name = marker.split()[1]
                trailing = section[len(section.rstrip("\n")):]
                lines = section.rstrip("\n").split("\n")
                lines, problem = update_section(args.kilnc, name, lines,
                                                trailing, tmp)
                if problem:
                    print("%s: %s" % (fname, problem), file=sys.stderr)
                    status = 1
                out.append(marker + "\n".join(lines) + trailing)
            new = "".join(out)
            if new != text:
                open(fname, "w").write(new)
                print("updated", fname)
    return status


if __name__ == "__main__":
    sys.exit(main())
