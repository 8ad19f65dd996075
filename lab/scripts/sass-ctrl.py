#!/usr/bin/env python3
"""Prints one kernel's SASS (from `cuobjdump -sass`) with each instruction's control bits decoded:
stall cycles, the scoreboard it writes (wb) and reads (rb), and the scoreboards it waits on.
Usage: cuobjdump -sass <binary> > k.sass; lab/scripts/sass-ctrl.py k.sass <function-substring> [from to]
(from/to: hex offsets inside the function). Bits as in the sm_70+ encoding: the top 23 bits of
the instruction's second 64-bit word hold stall (4), yield (1), write barrier (3), read barrier (3),
wait mask (6) and reuse (4); barrier 7 means none."""
import re
import sys


def main():
    lines = open(sys.argv[1]).read().split('\n')
    want = sys.argv[2]
    lo, hi = (int(sys.argv[3], 16), int(sys.argv[4], 16)) if len(sys.argv) > 4 else (0, 1 << 40)
    inside = False
    i = 0
    while i < len(lines):
        if 'Function :' in lines[i]:
            inside = want in lines[i]
        m = re.match(r'\s+/\*([0-9a-f]{4,6})\*/\s+(.*?);\s+/\* (0x[0-9a-f]+) \*/', lines[i])
        if inside and m and i + 1 < len(lines):
            second = re.search(r'/\* (0x[0-9a-f]+) \*/', lines[i + 1])
            ctrl = int(second.group(1), 16) >> 41
            addr = int(m.group(1), 16)
            if lo <= addr <= hi:
                wb, rb, mask = (ctrl >> 5) & 7, (ctrl >> 8) & 7, (ctrl >> 11) & 0x3f
                waits = ','.join(str(b) for b in range(6) if mask >> b & 1)
                print(f"{addr:05x} {m.group(2).strip()[:64]:64s} stall {ctrl & 0xf:2d} "
                      f"wb {wb if wb != 7 else '-'} rb {rb if rb != 7 else '-'} wait [{waits}]")
            i += 2
            continue
        i += 1


if __name__ == '__main__':
    main()
