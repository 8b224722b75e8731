#!/usr/bin/python3
"""fatbin_archs.py FILE.so — which GPU code a CUDA object carries, without cuobjdump (which the
development machines lack): walks every fat binary (magic 0xBA55ED50) embedded in FILE and
prints one line per kind and architecture, e.g. "elf sm_90 10" (machine code) and
"ptx compute_90 10" (PTX), with how many fat binaries hold it. Exit 1 when FILE holds none.
Layout: a 16-byte header (magic, version, header size, size), then entries of a header
(kind: 1 PTX, 2 ELF; its header size and payload size at offsets 4 and 8; the architecture
times ten at offset 28) and the payload.
"""
import collections
import struct
import sys


def main():
    data = open(sys.argv[1], "rb").read()
    magic = struct.pack("<I", 0xBA55ED50)
    seen = collections.Counter()
    i = 0
    while (i := data.find(magic, i)) >= 0:
        _ver, hsz, size = struct.unpack_from("<HHQ", data, i + 4)
        if hsz != 16 or i + hsz + size > len(data):
            i += 4
            continue
        p, end = i + hsz, i + hsz + size
        while p + 32 <= end:
            kind, _v, ehsz, payload = struct.unpack_from("<HHII", data, p)
            arch = struct.unpack_from("<I", data, p + 28)[0]
            name = {1: ("ptx", "compute_%d"), 2: ("elf", "sm_%d")}.get(kind, ("kind%d" % kind, "%d"))
            seen[(name[0], name[1] % arch)] += 1
            if ehsz == 0:
                break
            p += ehsz + payload
        i = end
    for (kind, arch), n in sorted(seen.items()):
        print(kind, arch, n)
    return 0 if seen else 1


if __name__ == "__main__":
    sys.exit(main())
