#!/usr/bin/env python3
"""Compares the SASS of kernels in two builds (executables, libraries or object files).

A refactoring step that leaves a kernel's instruction stream unchanged cannot change its speed;
one that changes it needs a measured A/B on the GPU. Per kernel pair: instruction counts, registers,
and how many instructions differ once addresses, encodings and constant-bank offsets are masked.

  lab/scripts/sass_diff.py OLD NEW [--pair OLD_RE=NEW_RE ...] [--filter RE] [--show N] [--loose]

Without --pair, kernels are matched by their demangled-ish name with the anonymous-namespace
hashes removed. Needs cuobjdump on PATH (the CUDA toolkit's, or the one Triton's wheel carries).
"""
import argparse
import difflib
import re
import subprocess
import sys


LOOSE = False


def dump(path):
    out = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    kernels, name, body = {}, None, []
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                kernels[name] = body
            name, body = m.group(1), []
            continue
        if name is None:
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*(/\*.*\*/)?\s*$", line)
        if m and m.group(1):
            ins = m.group(1).rstrip(" ;")
            ins = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][K]", ins)
            ins = re.sub(r"\b0x[0-9a-f]{3,}\b", "ADDR", ins)
            if LOOSE:  # register names and every immediate: the instruction stream's shape alone
                ins = re.sub(r"\bU?R[0-9]+\b", "R", ins)
                ins = re.sub(r"\bU?P[0-9]\b", "P", ins)
                ins = re.sub(r"\b0x[0-9a-f]+\b", "IMM", ins)
            kernels[name] = body
            body.append(ins)
    if name:
        kernels[name] = body
    return kernels


def key(name):
    k = re.sub(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "ANON", name)
    return k


def regs(path):
    out = subprocess.run(["cuobjdump", "-res-usage", path], capture_output=True, text=True).stdout
    r, name = {}, None
    for line in out.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = m.group(1)
        m = re.search(r"REG:(\d+)", line)
        if m and name:
            r[name] = int(m.group(1))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--pair", action="append", default=[], help="OLD_RE=NEW_RE: match kernels by regex")
    ap.add_argument("--filter", default="", help="only kernels whose name matches")
    ap.add_argument("--show", type=int, default=0, help="print the first N differing lines per kernel")
    ap.add_argument("--loose", action="store_true", help="mask register names and immediates")
    a = ap.parse_args()
    global LOOSE
    LOOSE = a.loose
    old, new = dump(a.old), dump(a.new)
    ro, rn = regs(a.old), regs(a.new)
    pairs = []
    if a.pair:
        for p in a.pair:
            o_re, n_re = p.split("=", 1)
            os_ = [k for k in old if re.search(o_re, k)]
            ns_ = [k for k in new if re.search(n_re, k)]
            if len(os_) != 1 or len(ns_) != 1:
                print(f"pair {p}: {len(os_)} old and {len(ns_)} new matches", file=sys.stderr)
                for k in os_ + ns_:
                    print("   ", k, file=sys.stderr)
                continue
            pairs.append((os_[0], ns_[0]))
    else:
        nk = {key(k): k for k in new}
        for k in old:
            if a.filter and not re.search(a.filter, k):
                continue
            if key(k) in nk:
                pairs.append((k, nk[key(k)]))
            else:
                print(f"only in old: {k}")
        ok = {key(k) for k in old}
        for k in new:
            if (not a.filter or re.search(a.filter, k)) and key(k) not in ok:
                print(f"only in new: {k}")
    worst = 0
    for o, n in pairs:
        sm = difflib.SequenceMatcher(None, old[o], new[n], autojunk=False)
        changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal")
        worst = max(worst, changed)
        label = re.sub(r"^_ZN4loom", "", n)[:110]
        print(f"{len(old[o]):7d} {len(new[n]):7d} ins  regs {ro.get(o, '?'):>3}/{rn.get(n, '?'):<3}  differ {changed:6d}  {label}")
        if a.show and changed:
            shown = 0
            for line in difflib.unified_diff(old[o], new[n], lineterm="", n=1):
                print("      " + line)
                shown += 1
                if shown >= a.show:
                    break
    return 0


if __name__ == "__main__":
    sys.exit(main())
