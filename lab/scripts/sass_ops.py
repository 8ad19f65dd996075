#!/usr/bin/env python3
"""Opcode histogram difference between two kernels' SASS (a structural comparison that survives
register renaming and reordering): lab/scripts/sass_ops.py OLD NEW OLD_RE NEW_RE."""
import collections
import re
import subprocess
import sys


def ops(path, pattern):
    out = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    c, on = collections.Counter(), False
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            on = re.search(pattern, m.group(1)) is not None
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if on and m:
            c[m.group(2)] += 1
    return c


old, new = ops(sys.argv[1], sys.argv[3]), ops(sys.argv[2], sys.argv[4])
print(f"total {sum(old.values())} -> {sum(new.values())}")
for op in sorted(set(old) | set(new), key=lambda o: -abs(new[o] - old[o])):
    if old[op] != new[op]:
        print(f"  {op:32s} {old[op]:6d} {new[op]:6d} {new[op] - old[op]:+6d}")
