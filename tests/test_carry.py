"""sinklib.book.carry: the cache's small, complete entries go out to a folder with a checksum manifest and come
back into another machine's cache, never half an entry, never over what is there."""
import json
import os
import time

import pytest

from sinklib.book import carry
from sinklib.errors import ParameterError

K = ["0123456789abcdef", "fedcba9876543210", "00000000000000aa", "1111111111111111", "2222222222222222"]


def _write(path, data: bytes, age: float = 3600.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    t = time.time() - age
    os.utime(path, (t, t))


@pytest.fixture()
def cache(tmp_path):
    c = tmp_path / "cache"
    _write(c / "evals" / f"{K[0]}.json", b'{"score": 1}')
    _write(c / "backcopy" / f"{K[1]}.json", b'{"S": -1}')
    _write(c / "backcopy" / f"{K[1]}.pt", b"weights")
    _write(c / "backcopy" / f"{K[2]}.pt", b"half-written weights, no record yet")
    _write(c / "backcopy" / f"{K[3]}.json", b"{}", age=1.0)                      # just written
    _write(c / "vl" / K[3] / "meta.json", b"{}")
    _write(c / "vl" / K[3] / "model.safetensors", b"x" * (2 * 2**20))        # too large at max_mb=1
    _write(c / "tiny" / "models" / K[4] / "meta.json", b"{}")
    _write(c / "tiny" / "models" / K[4] / "model.safetensors", b"small")
    _write(c / "tiny" / "adapt_evals" / f"{K[0]}.json", b"[1]")
    _write(c / "tiny" / "adapt_evals" / f"{K[1]}.json.tmp", b"[")
    _write(c / "models" / "smollm2" / "model.safetensors", b"big weights")
    return c


def _rel(c, entries):
    return sorted(sorted(p.relative_to(c).as_posix() for p in e) for e in entries)


def test_export_carries_complete_small_entries_only(cache, tmp_path):
    keep, big, busy, old = carry.plan_export(cache, max_mb=1)
    assert old == []
    assert _rel(cache, keep) == [[f"backcopy/{K[1]}.json", f"backcopy/{K[1]}.pt"], [f"evals/{K[0]}.json"],
                                 [f"tiny/adapt_evals/{K[0]}.json"],
                                 [f"tiny/models/{K[4]}/meta.json", f"tiny/models/{K[4]}/model.safetensors"],
                                 [f"vl/{K[3]}/meta.json", f"vl/{K[3]}/weights.json"]]    # too large: its weights stay
    assert big == []
    digest = json.loads((cache / "vl" / K[3] / "weights.json").read_text())
    assert digest == {"sha256": carry.file_sha256(cache / "vl" / K[3] / "model.safetensors"), "bytes": 2 * 2**20}
    assert _rel(cache, busy) == [[f"backcopy/{K[2]}.pt"], [f"backcopy/{K[3]}.json"], [f"tiny/adapt_evals/{K[1]}.json.tmp"]]
    dest = tmp_path / "out"
    out = carry.export(dest, cache, max_mb=1)
    assert out["copied files"] == 8 and out["left out, too large"] == 0 and out["left out, incomplete"] == 3
    assert out["of which checkpoints without their weights"] == 1
    assert carry.export(tmp_path / "small", cache, max_mb=0.000001)["left out, too large"] == 5
    files = json.loads((dest / carry.MANIFEST).read_text())["files"]
    assert sorted(files) == sorted(x for e in _rel(cache, keep) for x in e) and not (dest / "models").exists()
    assert carry.export(dest, cache, max_mb=1)["copied files"] == 0                  # nothing new, nothing copied
    _write(cache / "evals" / f"{K[1]}.json", b"{}")
    assert carry.export(dest, cache, max_mb=1)["copied files"] == 1


def test_export_since_a_moment_leaves_out_what_was_written_before_it(cache, tmp_path, monkeypatch, capsys):
    """A job's export after a test run: `--since` the job's start keeps the entries the job wrote (or changed) and
    leaves out the older ones, counted."""
    start = time.time() - 600
    _write(cache / "evals" / f"{K[2]}.json", b'{"job": 1}', age=300)             # written by the job
    _write(cache / "tiny" / "models" / K[2] / "meta.json", b"{}")                # an old checkpoint, one file new
    _write(cache / "tiny" / "models" / K[2] / "model.safetensors", b"w", age=120)
    keep, big, busy, old = carry.plan_export(cache, max_mb=1, since=start)
    assert _rel(cache, keep) == [[f"evals/{K[2]}.json"],
                                 [f"tiny/models/{K[2]}/meta.json", f"tiny/models/{K[2]}/model.safetensors"]]
    assert len(old) == 7 and [f"evals/{K[0]}.json"] in _rel(cache, old)   # the fixture's, but the one just written
    out = carry.export(tmp_path / "out", cache, max_mb=1, since=start)
    assert out["copied files"] == 3 and out["left out, older than --since"] == 7
    assert "left out, older than --since" not in carry.export(tmp_path / "all", cache, max_mb=1)
    monkeypatch.setenv("SINKBOOK_CACHE", str(cache))
    moment = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start))
    assert carry.main(["export", str(tmp_path / "cli"), "--max-mb", "1", "--since", moment]) == 0
    assert json.loads(capsys.readouterr().out)["copied files"] == 3
    with pytest.raises(SystemExit):
        carry.main(["export", str(tmp_path / "bad"), "--since", "yesterday"])
    assert "not an ISO time" in capsys.readouterr().err


def test_import_fills_what_is_missing_and_never_overwrites(cache, tmp_path):
    dest = tmp_path / "out"
    carry.export(dest, cache, max_mb=1)
    other = tmp_path / "other"
    _write(other / "backcopy" / f"{K[1]}.json", b'{"S": 99}')                     # the same key, other content
    out = carry.import_(dest, other)
    assert out["conflicts (left as they were)"] == [f"backcopy/{K[1]}.json"]
    assert (other / "backcopy" / f"{K[1]}.json").read_bytes() == b'{"S": 99}'
    assert not (other / "backcopy" / f"{K[1]}.pt").exists()                         # never half an entry
    assert (other / "evals" / f"{K[0]}.json").read_bytes() == b'{"score": 1}'
    assert (other / "tiny" / "models" / K[4] / "model.safetensors").read_bytes() == b"small"
    assert out["copied files"] == 6 and carry.import_(dest, other)["copied files"] == 0
    assert (other / "vl" / K[3] / "meta.json").exists() and not (other / "vl" / K[3] / "model.safetensors").exists()


def test_a_damaged_export_is_refused_with_the_file_named(cache, tmp_path):
    dest = tmp_path / "out"
    carry.export(dest, cache, max_mb=1)
    (dest / "evals" / f"{K[0]}.json").write_bytes(b"changed")
    with pytest.raises(ParameterError, match=f"evals/{K[0]}.json"):
        carry.import_(dest, tmp_path / "other")
    with pytest.raises(ParameterError, match="not a folder written by"):
        carry.import_(tmp_path, tmp_path / "other")
    with pytest.raises(ParameterError, match="has no folder"):
        carry.plan_export(cache, ["nope"])


def test_command_line(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SINKBOOK_CACHE", str(cache))
    assert carry.main(["export", str(tmp_path / "out"), "--max-mb", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["copied files"] == 8
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path / "fresh"))
    assert carry.main(["import", str(tmp_path / "out")]) == 0
    assert (tmp_path / "fresh" / "evals" / f"{K[0]}.json").exists()
    assert carry.main(["export", str(tmp_path / "x"), "--folders", "nope"]) == 2
    assert "has no folder" in capsys.readouterr().err


def test_the_checkouts_committed_cache_is_imported_first(cache, tmp_path, monkeypatch, capsys):
    """`make reproduce`, `make book` and the job runners read back the repository's carried/ (none: nothing)."""
    from sinklib.core import resources

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.setattr(resources, "checkout_root", lambda: checkout)
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path / "fresh"))
    assert carry.import_committed() is None                              # no carried/ in this checkout
    carry.export(checkout / carry.COMMITTED, cache, max_mb=1)
    assert carry.import_committed()["copied files"] == 8
    assert "imported 8 file(s) from the committed cache (carried/)" in capsys.readouterr().out
    assert (tmp_path / "fresh" / "evals" / f"{K[0]}.json").read_bytes() == b'{"score": 1}'
    assert carry.import_committed()["copied files"] == 0                 # a second time: nothing new
    assert carry.main(["import"]) == 0                                   # the default folder is carried/
    monkeypatch.setattr(resources, "checkout_root", lambda: None)
    assert carry.import_committed() is None and carry.main(["import"]) == 2
    assert "no folder given" in capsys.readouterr().err


def test_a_damaged_committed_cache_warns_instead_of_stopping_the_run(cache, tmp_path, monkeypatch, capsys):
    from sinklib.core import resources

    checkout = tmp_path / "checkout"
    monkeypatch.setattr(resources, "checkout_root", lambda: checkout)
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path / "fresh"))
    carry.export(checkout / carry.COMMITTED, cache, max_mb=1)
    _write(checkout / carry.COMMITTED / "evals" / "ffffffffffffffff.json", b"{}")    # a file no manifest lists
    out = carry.import_committed()
    assert out["not in the manifest (ignored)"] == ["evals/ffffffffffffffff.json"]
    assert not (tmp_path / "fresh" / "evals" / "ffffffffffffffff.json").exists()
    assert not list((tmp_path / "fresh").rglob("*.carry.tmp"))
    (checkout / carry.COMMITTED / "evals" / f"{K[0]}.json").write_bytes(b"changed")
    assert carry.import_committed() is None
    assert "was not imported" in capsys.readouterr().out
