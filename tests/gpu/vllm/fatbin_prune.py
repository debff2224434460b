"""Keeps only one GPU architecture's machine code in a shared object's CUDA fat binaries.

    python fatbin_prune.py LIB.so OUT.so 90          # sm_90 cubins only
    python fatbin_prune.py LIB.so OUT.so 90 --keep-ptx

A CUDA shared object carries its device code in the ELF section `.nv_fatbin`: a run of fat
binaries, each a 16-byte header (magic 0xBA55ED50, version u16, header size u16, payload size
u64) followed by entries (kind u16: 1 PTX, 2 ELF cubin; version u16; entry header size u32;
payload size u64; the SM number, u32 at byte 28 of the entry header). The driver walks a fat
binary's entries and loads the one for its GPU, so entries for other GPUs can go: the entries
kept are moved to the front of their fat binary, its payload size is shrunk, and the freed tail
is zeroed (xz packs it to almost nothing). Nothing else moves: the section, every fat binary's
offset (which the host code's registration records point at), symbols and relocations stay.

A fat binary with no entry for the architecture (kernels never built for it) would become empty,
which the runtime may refuse at load time; it keeps its own smallest entry instead, so that it
stays what it was for this GPU: a fat binary with no image for it.
No compiling, no CUDA toolkit: readelf (binutils) finds the section.
"""

from __future__ import annotations

import argparse
import dataclasses
import struct
import subprocess
import sys

MAGIC = 0xBA55ED50
HEADER = struct.Struct("<IHHQ")  # magic, version, header size, payload size
ENTRY = struct.Struct("<HHIQ")  # kind, version, entry header size, payload size
ARCH_AT = 28  # the SM number's offset inside an entry header
PTX, CUBIN = 1, 2


@dataclasses.dataclass(frozen=True)
class Entry:
    start: int  # file offset of the entry header
    size: int  # header + payload bytes
    kind: int
    arch: int


@dataclasses.dataclass(frozen=True)
class FatBinary:
    start: int  # file offset of the fat binary's header
    header_size: int
    payload_size: int
    entries: tuple[Entry, ...]


def fatbin_section(path: str) -> tuple[int, int] | None:
    """(file offset, size) of `.nv_fatbin`, or None."""
    listing = subprocess.run(["readelf", "-S", "-W", path], check=True, capture_output=True,
                             text=True).stdout
    for line in listing.splitlines():
        if " .nv_fatbin " in line:
            # [Nr] Name Type Address Off Size ...
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    return None


def fat_binaries(data: bytes, offset: int, size: int) -> list[FatBinary]:
    found, pos, end = [], offset, offset + size
    while pos + HEADER.size <= end:
        magic, _, header_size, payload_size = HEADER.unpack_from(data, pos)
        if magic != MAGIC:  # padding between fat binaries (8-byte aligned)
            pos += 8
            continue
        entries, at = [], pos + header_size
        while at < pos + header_size + payload_size:
            kind, _, entry_header, entry_payload = ENTRY.unpack_from(data, at)
            (arch,) = struct.unpack_from("<I", data, at + ARCH_AT)
            entries.append(Entry(at, entry_header + entry_payload, kind, arch))
            at += entry_header + entry_payload
        found.append(FatBinary(pos, header_size, payload_size, tuple(entries)))
        pos += header_size + payload_size
    return found


def prune(data: bytearray, section: tuple[int, int] | None, arch: int,
          keep_ptx: bool) -> dict[str, int]:
    """Prunes `data` (a shared object's bytes, `section` its .nv_fatbin) in place."""
    stats = {"fat_binaries": 0, "without_arch": 0, "kept_bytes": 0, "zeroed_bytes": 0}
    if section is None:
        return stats
    for fat in fat_binaries(bytes(data), *section):
        stats["fat_binaries"] += 1
        kept = [e for e in fat.entries if e.arch == arch and (e.kind == CUBIN or keep_ptx)]
        if keep_ptx:  # PTX of an older architecture can be compiled for this one by the driver
            kept += [e for e in fat.entries if e.kind == PTX and e.arch < arch]
        if not kept:
            stats["without_arch"] += 1
            kept = [min(fat.entries, key=lambda e: e.size)] if fat.entries else []
        payload = b"".join(bytes(data[e.start:e.start + e.size])
                           for e in sorted(kept, key=lambda e: e.start))
        assert len(payload) <= fat.payload_size
        body = fat.start + fat.header_size
        data[body:body + fat.payload_size] = payload + bytes(fat.payload_size - len(payload))
        struct.pack_into("<Q", data, fat.start + 8, len(payload))
        stats["kept_bytes"] += len(payload)
        stats["zeroed_bytes"] += fat.payload_size - len(payload)
    return stats


def prune_file(source: str, target: str, arch: int, keep_ptx: bool = False) -> dict[str, int]:
    with open(source, "rb") as file:
        data = bytearray(file.read())
    stats = prune(data, fatbin_section(source), arch, keep_ptx)
    with open(target, "wb") as file:
        file.write(data)
    return stats


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("arch", type=int, help="SM number, e.g. 90")
    parser.add_argument("--keep-ptx", action="store_true")
    args = parser.parse_args(argv)
    stats = prune_file(args.source, args.target, args.arch, args.keep_ptx)
    print(f"{args.source}: {stats['fat_binaries']} fat binaries ({stats['without_arch']} without "
          f"sm_{args.arch}), kept {stats['kept_bytes']} B, zeroed {stats['zeroed_bytes']} B")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
