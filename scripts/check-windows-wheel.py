"""Checks a Windows wheel built here (`WINDOWS_WHEEL=1 make check-windows`): one wheel for the
Python asked for, tagged `cp3X-cp3X-win_amd64` in its name and its WHEEL file, holding the
package and `kerman/_core.cp3X-win_amd64.pyd`, an x86-64 PE DLL that exports `PyInit__core`
and imports `python3X.dll` and only DLLs every Windows has (none of MinGW's runtime DLLs,
which a user's machine lacks). It cannot be imported here: there is no Windows CPython.

Usage: check-windows-wheel.py WHEEL_DIR 3.12
"""

from __future__ import annotations

import struct
import sys
import zipfile
from pathlib import Path

# Windows' own DLLs (and its API sets) that a Rust extension may import; anything else would
# have to be shipped beside it.
SYSTEM_DLLS = {
    "kernel32.dll",
    "ntdll.dll",
    "advapi32.dll",
    "bcryptprimitives.dll",
    "ws2_32.dll",
    "userenv.dll",
    "msvcrt.dll",
    "ucrtbase.dll",
    "crypt32.dll",
    "secur32.dll",
    "ncrypt.dll",
    "bcrypt.dll",
    "shell32.dll",
    "ole32.dll",
    "user32.dll",
    "synchronization.dll",
    "iphlpapi.dll",
}


def fail(message: str) -> None:
    sys.exit(f"check-windows-wheel: {message}")


def pe_sections(data: bytes) -> tuple[int, list[tuple[int, int, int]], int, int]:
    """The machine, the sections (virtual address, size, file offset) and the import and export
    directories' RVAs of a PE image."""
    if data[:2] != b"MZ":
        fail("the .pyd is not a PE image")
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[pe : pe + 4] != b"PE\0\0":
        fail("no PE signature")
    machine, nsections = struct.unpack_from("<HH", data, pe + 4)
    optional_size = struct.unpack_from("<H", data, pe + 20)[0]
    optional = pe + 24
    if struct.unpack_from("<H", data, optional)[0] != 0x20B:
        fail("not a PE32+ (64-bit) image")
    export_rva = struct.unpack_from("<I", data, optional + 112)[0]
    import_rva = struct.unpack_from("<I", data, optional + 120)[0]
    sections = []
    table = optional + optional_size
    for i in range(nsections):
        vsize, vaddr, _raw_size, raw_ptr = struct.unpack_from("<IIII", data, table + 40 * i + 8)
        sections.append((vaddr, vsize, raw_ptr))
    return machine, sections, import_rva, export_rva


def offset_of(rva: int, sections: list[tuple[int, int, int]]) -> int:
    for vaddr, vsize, raw in sections:
        if vaddr <= rva < vaddr + max(vsize, 1):
            return raw + rva - vaddr
    fail(f"RVA {rva:#x} is in no section")
    raise AssertionError


def c_string(data: bytes, at: int) -> str:
    return data[at : data.index(b"\0", at)].decode("ascii")


def imports_and_exports(data: bytes) -> tuple[list[str], list[str]]:
    machine, sections, import_rva, export_rva = pe_sections(data)
    if machine != 0x8664:
        fail(f"machine {machine:#x}, not x86-64")
    dlls = []
    at = offset_of(import_rva, sections)
    while True:
        name_rva = struct.unpack_from("<I", data, at + 12)[0]
        if name_rva == 0:
            break
        dlls.append(c_string(data, offset_of(name_rva, sections)))
        at += 20
    exports = []
    if export_rva:
        at = offset_of(export_rva, sections)
        count, _, names_rva = struct.unpack_from("<III", data, at + 24)
        names = offset_of(names_rva, sections)
        exports = [c_string(data, offset_of(struct.unpack_from("<I", data, names + 4 * i)[0], sections)) for i in range(count)]
    return dlls, exports


def main() -> None:
    folder, version = Path(sys.argv[1]), sys.argv[2]
    tag = "cp" + version.replace(".", "")
    wheels = sorted(folder.glob("kerman-*.whl"))
    if [w.name.split("-", 2)[2] for w in wheels] != [f"{tag}-{tag}-win_amd64.whl"]:
        fail(f"expected one {tag}-{tag}-win_amd64 wheel in {folder}, found {[w.name for w in wheels]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        pyd = f"kerman/_core.{tag}-win_amd64.pyd"
        for needed in (pyd, "kerman/__init__.py", "kerman/_core.pyi"):
            if needed not in names:
                fail(f"{needed} is not in {wheels[0].name}")
        stray = [n for n in names if n.endswith((".so", ".dylib", ".dll", ".a"))]
        if stray:
            fail(f"files for another platform or link step: {stray}")
        metadata = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        wheel_tags = [line.split(":", 1)[1].strip() for line in wheel.read(metadata).decode().splitlines() if line.startswith("Tag:")]
        if wheel_tags != [f"{tag}-{tag}-win_amd64"]:
            fail(f"WHEEL tags {wheel_tags}")
        dlls, exports = imports_and_exports(wheel.read(pyd))
    python_dll = f"python{version.replace('.', '')}.dll"
    if python_dll not in [d.lower() for d in dlls]:
        fail(f"{pyd} does not import {python_dll}: {dlls}")
    foreign = [d for d in dlls if d.lower() not in SYSTEM_DLLS | {python_dll} and not d.lower().startswith("api-ms-win-")]
    if foreign:
        fail(f"{pyd} needs DLLs a Windows machine does not have: {foreign}")
    if "PyInit__core" not in exports:
        fail(f"{pyd} does not export PyInit__core")
    print(f"check-windows-wheel: {wheels[0].name}: {pyd}, x86-64, imports {', '.join(sorted(dlls))}; ok")


if __name__ == "__main__":
    main()
