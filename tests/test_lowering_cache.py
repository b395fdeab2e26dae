"""The lowering cache: keyed by the asset's bytes, stale and damaged entries rebuilt."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

from ssmport.bundle import Bundle
from ssmport.runtime import STAMP, Runner, asset_sha256, lowered_path

TOKENS = [5, 6, 7, 300]


def _load(path):
    with Runner(path) as runner:
        return runner.lowered_now, runner.feed(TOKENS)


@pytest.fixture
def lowered(scratch_bundle):
    """A private bundle whose lowering is cached; yields (bundle, cache entry, logits)."""
    _load(scratch_bundle)
    bundle = Bundle.open(scratch_bundle)
    now, logits = _load(scratch_bundle)
    assert not now
    return bundle, lowered_path(bundle), logits


def test_key_is_the_asset_content_not_the_bundle(lowered, tmp_path):
    bundle, entry, _ = lowered
    moved = shutil.copytree(bundle.path, tmp_path / "elsewhere")
    manifest = (moved / "manifest.json").read_text().replace(bundle.manifest.bundle_id, "0" * 32)
    (moved / "manifest.json").write_text(manifest)
    assert lowered_path(Bundle.open(moved)) == entry
    assert not _load(moved)[0]


def test_changed_asset_is_lowered_again(lowered, pth_fp16_bundle):
    bundle, entry, old_logits = lowered
    before = asset_sha256(bundle.asset_path)
    # Same bundle directory, other asset bytes (a re-export in place).
    shutil.rmtree(bundle.asset_path)
    shutil.copytree(pth_fp16_bundle.path / "model.aimodel", bundle.asset_path)
    for key in ("main", "states", "prefill", "asset"):
        setattr(bundle.manifest, key, getattr(pth_fp16_bundle.manifest, key))
    bundle.save_manifest()
    assert asset_sha256(bundle.asset_path) != before
    assert lowered_path(bundle) != entry
    _, logits = _load(bundle.path)  # the fp16 asset's lowering (its export may have made it)
    _, expected = _load(pth_fp16_bundle.path)
    np.testing.assert_array_equal(logits, expected)
    assert not np.array_equal(logits, old_logits)


@pytest.mark.parametrize("damage", ["rewrite-bytes", "truncate", "delete-file", "no-stamp", "bad-stamp"])
def test_damaged_entry_is_rebuilt(lowered, damage):
    bundle, entry, logits = lowered
    odix = next(p for p in entry.iterdir() if p.suffix == ".odix")
    if damage == "rewrite-bytes":  # same size, other bytes: the runtime would die loading it
        data = bytearray(odix.read_bytes())
        data[:4096] = os.urandom(4096)
        odix.write_bytes(bytes(data))
    elif damage == "truncate":
        with open(odix, "r+b") as f:
            f.truncate(100)
    elif damage == "delete-file":
        odix.unlink()
    elif damage == "no-stamp":  # e.g. an entry left by an older ssmport
        (entry / STAMP).unlink()
    else:
        (entry / STAMP).write_text("{not json")
    now, again = _load(bundle.path)
    assert now
    np.testing.assert_array_equal(again, logits)
    assert not _load(bundle.path)[0]


def test_unchanged_asset_is_hashed_once(lowered, monkeypatch):
    bundle, _, _ = lowered
    import hashlib

    calls = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: calls.append(a) or real(*a))
    asset_sha256(bundle.asset_path)
    # Only the memo's file name is hashed; the asset's bytes are not read again.
    assert len(calls) == 1 and calls[0] and len(calls[0][0]) < 4096


def test_a_complete_entry_written_meanwhile_is_kept(lowered, monkeypatch):
    """Two processes lowering one asset at once: the second to finish keeps the first's entry,
    which the first may be loading already (replacing it failed that load: test_clean_exit)."""
    from ssmport.runtime import lowering

    bundle, entry, logits = lowered
    before = os.stat(entry / STAMP).st_ino
    real, calls = lowering.cached_lowering_ok, []

    def not_yet_then_real(target, key):  # the first check runs before the other process is done
        calls.append(target)
        return False if len(calls) == 1 else real(target, key)

    monkeypatch.setattr(lowering, "cached_lowering_ok", not_yet_then_real)
    path, now = lowering.ensure_lowered(bundle)
    assert now and path == entry and len(calls) == 2
    assert os.stat(entry / STAMP).st_ino == before  # the entry in place was not replaced
    assert not list(entry.parent.glob(".lowering-*"))  # and our own copy is gone
    monkeypatch.setattr(lowering, "cached_lowering_ok", real)
    assert np.array_equal(_load(bundle.path)[1], logits)


# --- the size limit (SSMPORT_CACHE_LIMIT) -----------------------------------------------------
MB = 1 << 20


def _fake_entry(folder, name, size, last_used):
    """An entry of `size` bytes last used at `last_used` (only its stamp's mtime and file sizes
    matter to the eviction order)."""
    entry = folder / f"{name * 32}.aimodelx"
    entry.mkdir(parents=True)
    (entry / "model.odix").write_bytes(b"\0" * size)
    (entry / STAMP).write_text("{}")
    os.utime(entry / STAMP, (last_used, last_used))
    return entry


def _entry_bytes(entry):
    return sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())


@pytest.fixture
def own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SSMPORT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "lowered"


def test_least_recently_used_entries_go_when_a_lowering_passes_the_limit(own_cache, scratch_bundle, pth_fp16_bundle, monkeypatch):
    from ssmport.runtime import forget_lowering

    bundle = Bundle.open(scratch_bundle)
    assert _load(bundle.path)[0]
    kept = lowered_path(bundle)
    now = time.time()
    os.utime(kept / STAMP, (now - 5000, now - 5000))  # lowered long ago...
    oldest = _fake_entry(own_cache, "a", MB, now - 4000)
    older = _fake_entry(own_cache, "b", MB, now - 3000)
    assert not _load(bundle.path)[0]  # ...and used now: a hit moves it last

    fp16 = Bundle.open(pth_fp16_bundle.path)
    assert _load(fp16.path)[0]
    other = lowered_path(fp16)
    sizes = _entry_bytes(kept) + _entry_bytes(other)
    forget_lowering(fp16)  # lower it again, now under a limit that holds one fake
    monkeypatch.setenv("SSMPORT_CACHE_LIMIT", str(sizes + 3 * MB // 2))
    assert _load(fp16.path)[0]
    assert not oldest.exists() and older.exists() and kept.exists() and other.exists()
    assert not list(own_cache.glob(".stale-*"))


def test_the_new_entry_stays_when_it_alone_passes_the_limit(own_cache, scratch_bundle, monkeypatch):
    old = _fake_entry(own_cache, "c", MB, time.time())  # the most recent other entry goes too
    monkeypatch.setenv("SSMPORT_CACHE_LIMIT", "1KB")
    now, logits = _load(scratch_bundle)
    assert now and not old.exists()
    assert [p.name for p in own_cache.iterdir()] == [lowered_path(Bundle.open(scratch_bundle)).name]
    again, same = _load(scratch_bundle)
    assert not again
    np.testing.assert_array_equal(same, logits)


def test_a_limit_that_is_not_a_size_is_one_line(own_cache, scratch_bundle, monkeypatch):
    from ssmport.errors import SsmportError

    monkeypatch.setenv("SSMPORT_CACHE_LIMIT", "lots")
    with pytest.raises(SsmportError, match=r"^SSMPORT_CACHE_LIMIT 'lots' is not a size: give a positive number") as info:
        _load(scratch_bundle)
    assert "\n" not in str(info.value)
    assert not list(own_cache.glob("*.aimodelx"))
