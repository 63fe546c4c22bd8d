"""Names for native addresses, read from the objects' own symbol tables, outside the process that
recorded them (colltrace/rank/_crash.c writes an object's path and the offset in its file).

An object's symbols come from its `.symtab` and `.dynsym`, else from its separate debug file
(found by build id or `.gnu_debuglink`, as gdb finds them: /usr/lib/debug) or its MiniDebugInfo
(`.gnu_debugdata`). glibc's string functions are IFUNCs whose implementations are local symbols
a stripped libc does not name: where the object is mapped in this process too (the same file),
an implementation that starts the very function the address is in (`.eh_frame_hdr`) is named by
its IFUNC (memset for __memset_avx2_unaligned_erms, as it is where debug symbols name it too).
C++ names are demangled by c++filt, or libstdc++'s own demangler.

The ELF reading is by hand, with struct over the mapped file: libtorch_cpu.so has 530,000
symbols, and per-symbol objects (pyelftools) would take the watchdog seconds a crash.
"""
from __future__ import annotations

import bisect
import lzma
import mmap
import os
import shutil
import struct
import subprocess

SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
PT_LOAD = 1
STT_FUNC, STT_GNU_IFUNC = 2, 10
DEBUG_ROOT = "/usr/lib/debug"


class Elf:
    """The parts of an ELF file that name an address: its segments, sections and symbols."""

    def __init__(self, data, path: str = ""):
        self.path = path
        self.data = data
        if data[:4] != b"\x7fELF":
            raise ValueError(f"{path}: not an ELF file")
        self.is64 = data[4] == 2
        self.e = "<" if data[5] == 1 else ">"
        e = self.e
        if self.is64:
            (_, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
             shstrndx) = struct.unpack_from(e + "HHIQQQIHHHHHH", data, 16)
        else:
            (_, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
             shstrndx) = struct.unpack_from(e + "HHIIIIIHHHHHH", data, 16)
        self.loads = []
        for i in range(phnum):
            off = phoff + i * phentsize
            if self.is64:
                ptype, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from(e + "IIQQQQQQ", data, off)
            else:
                ptype, p_offset, p_vaddr, _, p_filesz, p_memsz, _, _ = struct.unpack_from(e + "IIIIIIII", data, off)
            if ptype == PT_LOAD:
                self.loads.append((p_offset, p_vaddr, max(p_filesz, p_memsz)))
        self.sections = []
        for i in range(shnum if shoff else 0):
            off = shoff + i * shentsize
            if self.is64:
                name, stype, _, addr, offset, size, link, _, _, entsize = struct.unpack_from(
                    e + "IIQQQQIIQQ", data, off)
            else:
                name, stype, _, addr, offset, size, link, _, _, entsize = struct.unpack_from(
                    e + "IIIIIIIIII", data, off)
            self.sections.append({"name": name, "type": stype, "addr": addr, "offset": offset, "size": size,
                                  "link": link, "entsize": entsize})
        if self.sections and shstrndx < len(self.sections):
            names = self.sections[shstrndx]
            for s in self.sections:
                s["name"] = self._str(names["offset"], s["name"])

    def _str(self, table_offset: int, index: int) -> str:
        start = table_offset + index
        end = self.data.find(b"\0", start)
        return bytes(self.data[start:end if end >= 0 else start]).decode("utf-8", "replace")

    def section(self, name: str) -> dict | None:
        return next((s for s in self.sections if s["name"] == name), None)

    def bytes_of(self, s: dict) -> bytes:
        return bytes(self.data[s["offset"]:s["offset"] + s["size"]])

    def vaddr(self, file_offset: int) -> int | None:
        """The link-time address of a file offset (through the loadable segment holding it)."""
        for p_offset, p_vaddr, size in self.loads:
            if p_offset <= file_offset < p_offset + size:
                return file_offset - p_offset + p_vaddr
        return None

    def build_id(self) -> str | None:
        s = self.section(".note.gnu.build-id")
        if s is None:
            return None
        namesz, descsz, ntype = struct.unpack_from(self.e + "III", self.data, s["offset"])
        start = s["offset"] + 12 + ((namesz + 3) & ~3)
        return bytes(self.data[start:start + descsz]).hex() if ntype == 3 else None

    def debuglink(self) -> str | None:
        s = self.section(".gnu_debuglink")
        if s is None:
            return None
        raw = self.bytes_of(s)
        return raw[:raw.find(b"\0")].decode("utf-8", "replace") or None

    def symbols_at(self, vaddrs: list[int], types=(STT_FUNC, STT_GNU_IFUNC, 0)) -> dict[int, tuple[str, int]]:
        """{vaddr: (symbol name, its start)} for the addresses a sized symbol covers."""
        out: dict[int, tuple[str, int]] = {}
        if not vaddrs:
            return out
        lo, hi = min(vaddrs), max(vaddrs)
        for s in self.sections:
            if s["type"] not in (SHT_SYMTAB, SHT_DYNSYM) or not s["entsize"] or s["link"] >= len(self.sections):
                continue
            strtab = self.sections[s["link"]]["offset"]
            fmt = self.e + ("IBBHQQ" if self.is64 else "IIIBBH")
            raw = self.data[s["offset"]:s["offset"] + s["size"] - s["size"] % s["entsize"]]
            for row in struct.iter_unpack(fmt, raw):
                if self.is64:
                    name, info, _, shndx, value, size = row
                else:
                    name, value, size, info, _, shndx = row
                if not size or value > hi or value + size <= lo or not shndx or (info & 0xF) not in types:
                    continue
                for a in vaddrs:
                    if value <= a < value + size:
                        text = self._str(strtab, name)
                        if a not in out or _better(text, value, *out[a]):
                            out[a] = (text, value)
        return out

    def ifuncs(self) -> list[str]:
        s = self.section(".dynsym")
        if s is None or not s["entsize"]:
            return []
        strtab = self.sections[s["link"]]["offset"]
        fmt = self.e + ("IBBHQQ" if self.is64 else "IIIBBH")
        out = []
        for row in struct.iter_unpack(fmt, self.data[s["offset"]:s["offset"] + s["size"] - s["size"] % s["entsize"]]):
            name, info = (row[0], row[1]) if self.is64 else (row[0], row[3])
            if info & 0xF == STT_GNU_IFUNC and (row[3] if self.is64 else row[5]):
                out.append(self._str(strtab, name))
        return out

    def function_starts(self) -> list[int]:
        """The start of every function with unwind information (`.eh_frame_hdr`'s table), sorted."""
        s = self.section(".eh_frame_hdr")
        if s is None:
            return []
        raw = self.bytes_of(s)
        if len(raw) < 4 or raw[0] != 1:
            return []
        ptr_enc, count_enc, table_enc = raw[1], raw[2], raw[3]
        pos = 4
        size = _enc_size(ptr_enc)
        if size is None:
            return []
        pos += size
        csize = _enc_size(count_enc)
        if csize is None or table_enc != 0x3B:   # datarel|sdata4: what every toolchain writes
            return []
        count = _read_enc(raw, 4 + size, count_enc, self.e)
        starts = []
        pos += csize
        for i in range(count):
            off = pos + i * 8
            if off + 8 > len(raw):
                break
            (initial,) = struct.unpack_from(self.e + "i", raw, off)
            starts.append(s["addr"] + initial)
        starts.sort()
        return starts


def _better(name: str, start: int, than: str, than_start: int) -> bool:
    """Of two symbols covering an address: the innermost (the later start), then of aliases the
    name a program calls (getpid, not __getpid)."""
    if start != than_start:
        return start > than_start
    return (len(name) - len(name.lstrip("_")), len(name)) < (len(than) - len(than.lstrip("_")), len(than))


def _enc_size(enc: int) -> int | None:
    return {0x00: 8, 0x03: 4, 0x0B: 4, 0x04: 8, 0x0C: 8, 0x1B: 4, 0x02: 2, 0x0A: 2}.get(
        enc & 0x7F if enc != 0xFF else 0xFF)


def _read_enc(raw: bytes, pos: int, enc: int, e: str) -> int:
    fmt = {0x03: "I", 0x0B: "i", 0x04: "Q", 0x0C: "q", 0x1B: "i", 0x02: "H", 0x0A: "h", 0x00: "Q"}[enc & 0x7F]
    return struct.unpack_from(e + fmt, raw, pos)[0]


class _Object:
    """One object file and what names its addresses: itself, its debug file, its MiniDebugInfo."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.elf = Elf(self.map, path)
        self.st = os.stat(path)
        self._extra: list[Elf] | None = None
        self._ifunc: dict[int, str] | None = None
        self._starts: list[int] | None = None
        self._named: dict[int, tuple[str, int] | None] = {}

    def extra(self) -> list[Elf]:
        """Symbol tables beyond the object's own: its separate debug file, its MiniDebugInfo."""
        if self._extra is None:
            self._extra = []
            for cand in _debug_files(self.path, self.elf):
                try:
                    with open(cand, "rb") as f:
                        self._extra.append(Elf(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), cand))
                    break
                except (OSError, ValueError):
                    continue
            s = self.elf.section(".gnu_debugdata")
            if s is not None:
                try:
                    self._extra.append(Elf(lzma.decompress(self.elf.bytes_of(s)), self.path + " (.gnu_debugdata)"))
                except (lzma.LZMAError, ValueError, struct.error):
                    pass
        return self._extra

    def ifunc_starts(self) -> dict[int, str]:
        """{link-time address of the implementation this CPU picks: the IFUNC's name}, for an
        object this process has mapped too (the same file); {} otherwise."""
        if self._ifunc is None:
            self._ifunc = {}
            names = self.elf.ifuncs()
            ours = _own_mapping(self.st, self.path) if names else None
            if ours is not None:
                import ctypes

                try:
                    lib = ctypes.CDLL(ours[2], mode=os.RTLD_NOLOAD | os.RTLD_LAZY)   # never loads anything new
                except OSError:
                    lib = None
                for name in names if lib is not None else ():
                    try:
                        addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                    except (AttributeError, TypeError, ValueError):
                        continue
                    off = _file_offset(addr, ours[3]) if addr else None
                    v = self.elf.vaddr(off) if off is not None else None
                    if v is not None:
                        self._ifunc.setdefault(v, name)
        return self._ifunc

    def starts(self) -> list[int]:
        if self._starts is None:
            self._starts = self.elf.function_starts()
        return self._starts

    def names(self, vaddrs: list[int]) -> dict[int, tuple[str, int]]:
        """{vaddr: (name, start)} for those something names; asked again (a file read while it
        grew, a watchdog's every round), answered from what was found before."""
        todo = [a for a in vaddrs if a not in self._named]
        if todo:
            found = self._find(todo)
            for a in todo:
                self._named[a] = found.get(a)
        return {a: hit for a in vaddrs if (hit := self._named[a]) is not None}

    def _find(self, vaddrs: list[int]) -> dict[int, tuple[str, int]]:
        found = self.elf.symbols_at(vaddrs)
        for elf in self.extra():
            missing = [a for a in vaddrs if a not in found]
            if not missing:
                break
            try:
                found.update(elf.symbols_at(missing))
            except struct.error:
                continue
        impl = self.ifunc_starts()
        if impl:
            # an IFUNC's implementation goes by the IFUNC's name (memset, not
            # __memset_avx2_unaligned_erms: what the program called)
            found = {a: ((impl[start], start) if start in impl else (name, start))
                     for a, (name, start) in found.items()}
            starts = self.starts()
            for a in vaddrs:
                i = bisect.bisect_right(starts, a) - 1
                if a not in found and i >= 0 and starts[i] in impl:
                    found[a] = (impl[starts[i]], starts[i])
        return found


def _debug_files(path: str, elf: Elf) -> list[str]:
    out = []
    bid = elf.build_id()
    if bid and len(bid) > 2:
        out.append(os.path.join(DEBUG_ROOT, ".build-id", bid[:2], bid[2:] + ".debug"))
    link = elf.debuglink()
    if link:
        d = os.path.dirname(os.path.realpath(path))
        out += [os.path.join(d, link), os.path.join(d, ".debug", link), DEBUG_ROOT + os.path.join(d, link)]
    return [p for p in out if os.path.isfile(p) and os.path.realpath(p) != os.path.realpath(path)]


def _own_mapping(st, path_there: str) -> tuple | None:
    """This process's mapping of the same file (its inode and name): (start, end, path, [(start,
    end, offset)])."""
    rows = []
    path = None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if (len(parts) < 6 or int(parts[4]) != st.st_ino
                        or os.path.basename(parts[5].strip()) != os.path.basename(path_there)):
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                rows.append((start, end, int(parts[2], 16)))
                path = parts[5].strip()
    except (OSError, ValueError):
        return None
    if not rows or path is None:
        return None
    return rows[0][0], rows[-1][1], path, rows


def _file_offset(addr: int, rows) -> int | None:
    for start, end, off in rows:
        if start <= addr < end:
            return addr - start + off
    return None


_objects: dict[tuple, _Object | None] = {}


def _object(path: str, inode: int | None) -> _Object | None:
    """The object at `path`, if it is still the file the rank had mapped (its inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if inode is not None and st.st_ino != inode:
        return None   # replaced since (a reinstall): its symbols would name the wrong code
    key = (path, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _objects:
        try:
            _objects[key] = _Object(path)
        except (OSError, ValueError, struct.error):
            _objects[key] = None
    return _objects[key]


def resolve(frames: list[dict]) -> list[dict]:
    """Frames as colltrace/tracefile/native.py parses them ({"path", "offset" (in the file),
    "inode", "pc": the address is the pc itself, not a return address}) -> the same frames
    with "symbol" (demangled; None where nothing names it) and "symbol_offset"."""
    by_object: dict[tuple, list[int]] = {}
    look: list[tuple | None] = []
    for fr in frames:
        obj = _object(fr["path"], fr.get("inode")) if fr.get("path") else None
        v = obj.elf.vaddr(fr["offset"]) if obj is not None and fr.get("offset") is not None else None
        if v is None:
            look.append(None)
            continue
        # a return address is just past its call: the call is what names the frame
        probe = v if fr.get("pc") or v == 0 else v - 1
        look.append((obj, v, probe))
        by_object.setdefault((id(obj),), []).append(probe)
    names: dict[tuple, dict[int, tuple[str, int]]] = {}
    for item in look:
        if item is not None and (id(item[0]),) not in names:
            try:
                names[(id(item[0]),)] = item[0].names(by_object[(id(item[0]),)])
            except (struct.error, ValueError, IndexError, KeyError):
                names[(id(item[0]),)] = {}
    out = []
    raw_names = []
    for fr, item in zip(frames, look, strict=True):
        sym = start = None
        if item is not None:
            hit = names[(id(item[0]),)].get(item[2])
            if hit is not None:
                sym, start = hit
        out.append(dict(fr, symbol=sym, symbol_offset=(item[1] - start) if sym is not None and item else None,
                        vaddr=item[1] if item else None))
        if sym:
            raw_names.append(sym)
    plain = demangle(raw_names)
    for fr in out:
        if fr["symbol"]:
            fr["symbol"] = plain.get(fr["symbol"], fr["symbol"])
    return out


# -- demangling ----------------------------------------------------------------------------------
_demangled: dict[tuple[str, bool], str] = {}


def demangle(names: list[str], types: bool = False) -> dict[str, str]:
    """{mangled: demangled} for C++ names (types: type names, as std::type_info::name() gives
    them); a name nothing can demangle stays as it is."""
    want = sorted({n for n in names if (n.startswith("_Z") or types) and (n, types) not in _demangled})
    if want:
        got = _cxxfilt(want, types) or _cxa_demangle(want, types) or {}
        for n in want:
            _demangled[(n, types)] = got.get(n) or n
    return {n: _demangled.get((n, types), n) for n in names}


def _cxxfilt(names: list[str], types: bool) -> dict[str, str] | None:
    exe = shutil.which("c++filt")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe] + (["-t"] if types else []), input="\n".join(names) + "\n",
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != len(names):
        return None
    return dict(zip(names, lines, strict=True))


def _cxa_demangle(names: list[str], types: bool) -> dict[str, str] | None:
    import ctypes

    try:
        lib = ctypes.CDLL("libstdc++.so.6")
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    libc = ctypes.CDLL(None)
    out = {}
    for n in names:
        status = ctypes.c_int(0)
        p = fn(n.encode(), None, None, ctypes.byref(status))
        if p and status.value == 0:
            out[n] = ctypes.string_at(p).decode("utf-8", "replace")
            libc.free(ctypes.c_void_p(p))
    return out
