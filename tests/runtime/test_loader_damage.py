"""Each kind of damage, in a build folder and in a wheel, gets the same one-line refusal from verify, from the
loader (driver faked) and from ``env``; it refuses that variant or that manifest, never another arch's."""

from __future__ import annotations

import json
import os
import zipfile

import pytest
from helpers.artifacts import (
    MANIFEST_DAMAGE,
    VARIANT_DAMAGE,
    all_plans,
    bind_all,
    first_variant,
    make_wheel,
    manifest_of,
    plans_of,
)
from helpers.hang import no_hang

from skinny_gemm.aot import verify
from skinny_gemm.runtime import diagnostics, loader
from skinny_gemm.runtime.artifacts import ENV_ARTIFACTS, PACKAGE_ARTIFACTS, artifacts_root
from skinny_gemm.runtime.manifest import ARCHS, MANIFEST_NAME


def lines_of(messages: list[str]) -> list[str]:
    """The refusal lines inside ArtifactWarning texts (each after the header line)."""
    return [line.strip() for text in messages for line in text.splitlines()[1:]]


def loader_lines(fresh) -> list[str]:
    """What the loader refuses on a machine with an H200 and a GB10, every shape bound."""
    fake = fresh(caps=[(9, 0), (12, 1)])
    return lines_of([str(w.message) for w in fake.warnings] + bind_all(0) + bind_all(1))


@pytest.mark.parametrize("name", sorted(VARIANT_DAMAGE))
def test_variant_damage_same_line_everywhere(name, fresh, art):
    damage, phrase = VARIANT_DAMAGE[name]
    v = first_variant(art)
    arch_dir = art / "sm_90a"
    damage(arch_dir, v)
    with no_hang("verify (a FIFO in place of a cubin)"):
        _, problems = verify.verify(art)
    assert len(problems) == 1 and problems[0].startswith(f"{arch_dir / v['file']}: "), problems
    assert phrase in problems[0], problems
    assert loader_lines(fresh) == problems
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])
    assert set(loader.DEVICES[1].table) == all_plans(art, "sm_121"), "the other arch is untouched"
    text = diagnostics.env_report()
    assert f"refused {v['file']}: {problems[0].split(': ', 1)[1]}" in text


@pytest.mark.parametrize("name", sorted(MANIFEST_DAMAGE))
def test_manifest_damage_same_line_everywhere(name, fresh, art):
    damage, phrase = MANIFEST_DAMAGE[name]
    arch_dir = art / "sm_90a"
    damage(arch_dir)
    with no_hang("verify (a FIFO in place of the manifest)"):
        _, problems = verify.verify(art)
    assert len(problems) == 1 and problems[0].startswith(f"{arch_dir / MANIFEST_NAME}: ") and phrase in problems[0], (
        problems
    )
    assert "\n" not in problems[0] and len(problems[0]) < 600
    assert loader_lines(fresh) == problems
    assert loader.DEVICES[0].table == {}
    assert set(loader.DEVICES[1].table) == all_plans(art, "sm_121"), "the other arch is untouched"
    text = diagnostics.env_report()
    assert f"artifacts: none usable ({problems[0]})" in text


ZIPPABLE = sorted(name for name in VARIANT_DAMAGE if name not in ("fifo", "directory"))


@pytest.mark.parametrize("name", ZIPPABLE + sorted(n for n in MANIFEST_DAMAGE if n != "manifest a fifo"))
def test_damage_in_a_wheel_gives_the_folder_line(name, art, tmp_path):
    """The wheel names each file by its place inside it; the reason is the build folder's."""
    arch_dir = art / "sm_90a"
    if name in VARIANT_DAMAGE:
        VARIANT_DAMAGE[name][0](arch_dir, first_variant(art))
    else:
        MANIFEST_DAMAGE[name][0](arch_dir)
    _, folder = verify.verify(art)
    whl = make_wheel(art, tmp_path / "skinny_gemm-0.1.0-0sm90a.sm121-py3-none-any.whl")
    _, wheel = verify.verify(whl)
    inside = f"{whl}!skinny_gemm/artifacts/"
    assert [line.replace(inside, f"{art}/") for line in wheel] == folder and wheel[0].startswith(inside), wheel


def test_clean_wheel_verifies(art, tmp_path):
    whl = make_wheel(art, tmp_path / "ok.whl")
    assert verify.verify(whl) == (sorted(ARCHS), [])


@pytest.mark.parametrize("entry", ["../evil.txt", "/abs/evil.txt", "skinny_gemm/../../evil.txt", "c:\\evil.txt"])
def test_wheel_entry_outside_the_wheel_refused(art, tmp_path, entry):
    whl = make_wheel(art, tmp_path / "evil.whl", extra={entry: b"x"})
    assert verify.verify(whl) == ([], [f"{whl}: entry {entry!r} is not a plain path inside the wheel"])
    assert not (tmp_path / "evil.txt").exists()


def _patch_first_entry(whl, local_offset: int, central_offset: int, value: bytes):
    """Overwrite bytes of the first entry's local header and its central-directory record."""
    blob = bytearray(whl.read_bytes())
    local = blob.index(b"PK\x03\x04")
    central = blob.index(b"PK\x01\x02")
    blob[local + local_offset : local + local_offset + len(value)] = value
    blob[central + central_offset : central + central_offset + len(value)] = value
    whl.write_bytes(bytes(blob))


def test_wheel_with_unknown_compression_is_one_line(art, tmp_path):
    whl = make_wheel(art, tmp_path / "odd.whl")
    _patch_first_entry(whl, 8, 10, (99).to_bytes(2, "little"))
    _, problems = verify.verify(whl)
    assert len(problems) == 1 and problems[0].startswith(f"{whl}: not a readable wheel"), problems


def test_wheel_with_encrypted_entry_is_one_line(art, tmp_path):
    whl = make_wheel(art, tmp_path / "locked.whl")
    first = zipfile.ZipFile(whl).infolist()[0]
    _patch_first_entry(whl, 6, 8, (first.flag_bits | 1).to_bytes(2, "little"))
    _, problems = verify.verify(whl)
    assert problems == [f"{whl}: entry {first.filename!r} is encrypted"], problems


def test_not_a_zip_is_one_line(tmp_path):
    whl = tmp_path / "junk.whl"
    whl.write_bytes(b"not a zip")
    _, problems = verify.verify(whl)
    assert len(problems) == 1 and problems[0].startswith(f"{whl}: not a readable wheel (BadZipFile"), problems


def test_fifo_cubin_does_not_hang_env_or_the_loader(fresh, art):
    v = first_variant(art)
    path = art / "sm_90a" / v["file"]
    path.unlink()
    os.mkfifo(path)
    with no_hang("the loader and env (a FIFO in place of a cubin)"):
        assert any("a FIFO, not a regular file" in line for line in loader_lines(fresh))
        assert "a FIFO, not a regular file" in diagnostics.env_report()


def test_huge_cubin_is_refused_without_reading_it(fresh, art, monkeypatch):
    from skinny_gemm.runtime import artifacts

    monkeypatch.setattr(artifacts, "CUBIN_CAP", 4096)
    v = first_variant(art)
    lines = loader_lines(fresh)
    assert any(
        line.startswith(str(art / "sm_90a" / v["file"])) and "more than the 4096 allowed" in line for line in lines
    ), lines


def test_override_is_warned_once_printed_and_verified(fresh, art, monkeypatch, capsys):
    from skinny_gemm.aot import cli

    fake = fresh()
    assert len(fake.override_warnings) == 1 and str(art) in str(fake.override_warnings[0].message)
    loader.load()  # a second load is a no-op: no second warning
    assert f"artifacts root: {art} (from ${ENV_ARTIFACTS}" in diagnostics.env_report()
    (art / "sm_121" / first_variant(art, "sm_121")["file"]).write_bytes(b"junk")
    assert cli.main(["verify"]) == 1, "verify with no path checks what the loader would load: the override"
    out = capsys.readouterr().out
    assert f"FAIL {art / 'sm_121' / first_variant(art, 'sm_121')['file']}: sha256 mismatch" in out
    monkeypatch.delenv(ENV_ARTIFACTS)
    assert artifacts_root() == PACKAGE_ARTIFACTS


def test_no_override_no_warning(fresh, art, monkeypatch):
    monkeypatch.delenv(ENV_ARTIFACTS)
    assert fresh().override_warnings == []
    assert "from $" not in diagnostics.env_report()


def test_manifest_fields_typed_in_every_record(fresh, art):
    """A number where a string belongs in the second variant: only that variant goes, with a line naming it."""
    data = manifest_of(art)
    data["variants"][1]["symbol"] = 7
    (art / "sm_90a" / MANIFEST_NAME).write_text(json.dumps(data))
    v = data["variants"][1]
    expected = f"{art / 'sm_90a' / v['file']}: field 'symbol' is 7, must be 'skinny_{v['id']}_0' (its config's symbol)"
    assert loader_lines(fresh) == [expected]


POOL = [None, "x", "", 1.5, -1, 0, 10**30, [], {}, True, [1, 2, 3], {"a": 1}]


def test_every_field_of_every_kind_refused_cleanly(art):
    """Each manifest, variant, config, grid and plan field replaced by values of the wrong type or size: the
    validator returns or raises its own one-line error, never anything else (no traceback in verify or env)."""
    import copy

    from skinny_gemm.runtime.artifacts import open_dir

    arch_dir = art / "sm_90a"
    base = manifest_of(art)
    vid = base["variants"][0]["id"]
    places = [([], key) for key in base] + [(["variants", 0], key) for key in base["variants"][0]]
    places += [(["variants", 0, "config"], key) for key in base["variants"][0]["config"]]
    places += [(["variants", 0, "grid"], key) for key in base["variants"][0]["grid"]]
    places += [(["plans", 0], key) for key in base["plans"][0]]
    outcomes = {"ok": 0, "manifest": 0, "variant": 0}
    for path, key in places:
        for value in POOL:
            data = copy.deepcopy(base)
            node = data
            for step in path:
                node = node[step]
            node[key] = value
            (arch_dir / MANIFEST_NAME).write_text(json.dumps(data))
            lib = open_dir(arch_dir, "sm_90a")
            if lib.manifest is None:
                assert lib.error.startswith(f"{arch_dir / MANIFEST_NAME}: ") and "\n" not in lib.error
                outcomes["manifest"] += 1
                continue
            lines = lib.check_all()
            assert all(line.startswith(str(arch_dir)) and "\n" not in line for line in lines), lines
            outcomes["variant" if lines else "ok"] += 1
            if path == ["variants", 0, "config"] and type(value) is not type(base["variants"][0]["config"][key]):
                assert lib.check(vid) is None, f"config {key}={value!r} passed"
    assert outcomes["manifest"] > 50 and outcomes["variant"] > 50, outcomes


def test_a_check_that_fails_itself_refuses_only_its_own_file(fresh, art, monkeypatch):
    """Belt and braces: an unexpected error inside a check refuses that manifest or variant, not the load."""
    from skinny_gemm.runtime import artifacts as artifacts_mod
    from skinny_gemm.runtime import manifest as manifest_mod

    real = manifest_mod._manifest

    def broken(path, raw, *args):
        if raw.get("arch") == "sm_90a":
            raise TypeError("unexpected")
        return real(path, raw, *args)

    monkeypatch.setattr(manifest_mod, "_manifest", broken)
    lines = loader_lines(fresh)
    assert lines == [f"{art / 'sm_90a' / MANIFEST_NAME}: malformed manifest (TypeError: unexpected)"]
    assert set(loader.DEVICES[1].table) == all_plans(art, "sm_121")
    monkeypatch.setattr(manifest_mod, "_manifest", real)
    monkeypatch.setattr(artifacts_mod, "_check_variant", lambda man, vid: 1 / 0)
    monkeypatch.setattr(loader, "STATE", loader.State())
    monkeypatch.setattr(loader, "DEVICES", {})
    lines = loader_lines(fresh)
    assert lines and all("malformed variant (ZeroDivisionError" in line for line in lines)


def test_shared_memory_over_the_arch_limit_is_refused_everywhere(fresh, art, monkeypatch):
    """A variant whose static plus dynamic shared memory passes its arch's per-CTA limit is refused by verify, the
    loader and env with the same line, and only it: with the H200's limit lowered to 64 KB the shared-memory rings of
    the plan (the mma rings' 48-196 KB of dynamic shared memory, the wgmma kernels' TMA rings) go, every other variant
    stays."""
    from skinny_gemm.kernels.config import SMEM_PER_CTA
    from skinny_gemm.runtime import artifacts

    monkeypatch.setattr(artifacts, "SMEM_PER_CTA", {**SMEM_PER_CTA, "sm_90a": 64 * 1024})
    variants = manifest_of(art)["variants"]
    over = {v["id"] for v in variants if v["dynamic_smem"] > 60 * 1024}
    assert over and all(v["config"].get("ring") or v["config"]["kind"] == "wgmma" for v in variants if v["id"] in over)
    _, problems = verify.verify(art)
    assert {p.split(": ", 1)[0] for p in problems} == {str(art / "sm_90a" / f"{vid}.cubin") for vid in over}
    assert all("of dynamic shared memory, over the 65536 a CTA may take on sm_90a" in p for p in problems), problems
    assert sorted(loader_lines(fresh)) == sorted(problems)
    refused = set().union(*(plans_of(art, vid) for vid in over))
    assert set(loader.DEVICES[0].table) == all_plans(art) - refused
    assert set(loader.DEVICES[1].table) == all_plans(art, "sm_121"), "the other arch is untouched"
