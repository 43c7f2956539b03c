"""The installed-models store: import / list / rm round trips (in place and copied), refusals that
register nothing (truncated, non-GGUF, foreign-vocabulary draft, escaping names), a manifest that
survives a crash mid-write, the registry's exact lookup, and `generate --model NAME`."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.app.paths import resolve_models
from localspec.engine.errors import LocalspecError
from localspec.models import fit, library, registry


@pytest.fixture
def data(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "data"
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(root))
    return root


def cli(data: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(data)}
    return subprocess.run([sys.executable, "-m", "localspec.app.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def store_files(data: Path) -> list[str]:
    folder = data / "models"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                  and p.name not in (".lock", "manifest.json")) if folder.exists() else []


def test_import_in_place_list_rm_round_trip(data, tiny):
    model = library.import_model("tiny", tiny.target_gguf, tiny.draft_gguf)
    assert model.location == "in place" and not model.target.owned
    [row] = library.list_models()
    assert row.name == "tiny" and not row.missing
    assert row.model.target.path == Path(tiny.target_gguf).resolve()
    assert row.model.draft.path == Path(tiny.draft_gguf).resolve()
    assert row.model.size == os.path.getsize(tiny.target_gguf) + os.path.getsize(tiny.draft_gguf)
    assert row.model.quantization == "F32"            # general.file_type 0
    assert row.fit in ("fits in VRAM", "fits in RAM", "too big", "unknown")
    assert row.context == fit.listed_context(row.model.target, fit.free_memory()) and row.context >= 64
    assert store_files(data) == []                     # nothing copied
    assert resolve_models("tiny", None) == (row.model.target.path, row.model.draft.path)
    assert resolve_models("tiny", str(tiny.target_gguf))[1] == Path(tiny.target_gguf)  # --draft wins
    library.remove_model("tiny")
    assert library.list_models() == []
    assert Path(tiny.target_gguf).is_file() and Path(tiny.draft_gguf).is_file()  # user files stay


def test_import_copy_round_trip_via_cli(data, tiny):
    done = cli(data, "import", "tc", str(tiny.target_gguf), "--draft", str(tiny.draft_gguf), "--copy")
    assert done.returncode == 0, done.stderr
    assert store_files(data) == ["tc/draft.gguf", "tc/target.gguf"]   # no .partial left
    assert (data / "models/tc/target.gguf").read_bytes() == Path(tiny.target_gguf).read_bytes()
    listed = cli(data, "list")
    assert listed.returncode == 0 and "tc" in listed.stdout and "store" in listed.stdout
    assert "F32" in listed.stdout and "draft.gguf" in listed.stdout
    [row] = library.list_models()
    assert "CTX" in listed.stdout and f" {row.context} " in listed.stdout   # the context a run gets here
    assert cli(data, "rm", "tc").returncode == 0
    assert store_files(data) == [] and Path(tiny.target_gguf).is_file()
    assert "No models installed" in cli(data, "list").stdout


def test_name_taken_is_refused(data, tiny):
    library.import_model("tiny", tiny.target_gguf)
    with pytest.raises(LocalspecError, match="already installed"):
        library.import_model("tiny", tiny.draft_gguf)
    assert library.get_model("tiny").target.path == Path(tiny.target_gguf).resolve()


@pytest.mark.parametrize("copy", [False, True])
def test_truncated_and_non_gguf_refused_nothing_registered(data, tiny, tmp_path, copy):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(tiny.target_gguf).read_bytes()[:100_000])
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("not a model\n" * 10)
    with pytest.raises(LocalspecError, match="truncated"):
        library.import_model("cut", cut, copy=copy)
    with pytest.raises(LocalspecError, match="Not a GGUF"):
        library.import_model("bogus", bogus, copy=copy)
    with pytest.raises(LocalspecError, match="truncated"):          # a bad draft refuses the pair
        library.import_model("pair", tiny.target_gguf, cut, copy=copy)
    assert library.list_models() == [] and store_files(data) == []
    proc = cli(data, "import", "cut", str(cut))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "truncated" in proc.stderr and "fix:" in proc.stderr


def test_draft_with_other_vocabulary_refused_naming_both(data, tiny, tmp_path):
    with pytest.raises(LocalspecError) as err:
        library.import_model("mixed", tiny.target_gguf, tiny.other_vocab_gguf, copy=True)
    cause = err.value.cause
    assert "target.gguf" in cause and "other-vocab.gguf" in cause
    assert str(tiny.vocab_size) in cause and "300" in cause
    # Same size, different token texts: the fingerprint catches it.
    raw = Path(tiny.draft_gguf).read_bytes()
    assert b"<|im_end|>" in raw
    twisted = tmp_path / "twisted.gguf"
    twisted.write_bytes(raw.replace(b"<|im_end|>", b"<|im_eNd|>"))
    with pytest.raises(LocalspecError, match="different token lists") as err:
        library.import_model("mixed", tiny.target_gguf, twisted)
    assert "twisted.gguf" in err.value.cause and "target.gguf" in err.value.cause
    assert library.list_models() == [] and store_files(data) == []


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".hidden", "x" * 65, "", "a\\b", "/abs"])
def test_escaping_names_refused(data, tiny, name):
    with pytest.raises(LocalspecError, match="Bad model name"):
        library.import_model(name, tiny.target_gguf, copy=True)
    with pytest.raises(LocalspecError, match="Bad model name"):
        library.remove_model(name)
    assert library.list_models() == [] and store_files(data) == []
    assert not (data.parent / "escape").exists()


@pytest.mark.parametrize("file_name", ["../x.gguf", "a/../../x.gguf", ".x.gguf", "..gguf"])
def test_escaping_file_names_refused(data, file_name):
    with pytest.raises(LocalspecError, match="Bad model file name"):
        library.owned_path("ok", file_name)


def test_escaping_name_refused_on_the_command_line(data, tiny):
    proc = cli(data, "import", "../../evil", str(tiny.target_gguf), "--copy")
    assert proc.returncode == 2 and "Bad model name" in proc.stderr and "Traceback" not in proc.stderr
    assert not (data.parent / "evil").exists()


def test_manifest_survives_a_crash_mid_write(data, tiny, monkeypatch):
    library.import_model("tiny", tiny.target_gguf)
    folder = data / "models"
    before = (folder / "manifest.json").read_bytes()
    # A writer killed mid-write leaves a half-written temp file and a .partial copy behind.
    (folder / ".manifest.json.crash.tmp").write_text('{"version": 1, "models": {"half": {"tar')
    (folder / "half").mkdir()
    (folder / "half" / "target.gguf.partial").write_bytes(b"GGUF" + b"\0" * 100)
    assert [r.name for r in library.list_models()] == ["tiny"]

    # A write that dies before the rename leaves the old manifest and cleans its temp file.
    def boom(*_):
        raise OSError("killed")
    with monkeypatch.context() as patch, pytest.raises(OSError):
        patch.setattr(library.os, "replace", boom)
        library.import_model("second", tiny.draft_gguf)
    assert (folder / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in folder.glob(".manifest.json.*.tmp")) == [".manifest.json.crash.tmp"]
    assert [r.name for r in library.list_models()] == ["tiny"]
    assert json.loads(before)["models"].keys() == {"tiny"}


def test_interrupted_copy_leaves_nothing_installed(data, tiny, monkeypatch):
    library.import_model("tiny", tiny.target_gguf)

    real_copy = library.shutil.copyfileobj
    calls = []

    def second_fails(fin, fout, size):          # the target copies, the draft's copy dies
        calls.append(fin.name)
        if len(calls) == 2:
            raise OSError("disk full")
        real_copy(fin, fout, size)
    with monkeypatch.context() as patch, pytest.raises(OSError, match="disk full"):
        patch.setattr(library.shutil, "copyfileobj", second_fails)
        library.import_model("tc", tiny.target_gguf, tiny.draft_gguf, copy=True)
    assert [r.name for r in library.list_models()] == ["tiny"]
    assert store_files(data) == [] and not (data / "models" / "tc").exists()


def test_missing_referenced_file_is_shown(data, tiny, tmp_path):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(Path(tiny.target_gguf).read_bytes())
    library.import_model("mine", mine)
    mine.unlink()
    [row] = library.list_models()
    assert row.missing == (mine.resolve(),)
    with pytest.raises(LocalspecError, match="missing a file"):
        resolve_models("mine", None)


def test_fit_estimate(data, tiny, tmp_path, monkeypatch):
    from localspec.models import fit
    from localspec.models.gguf_file import read_gguf

    info = read_gguf(tiny.target_gguf)
    m = info.metadata
    layers, heads = m["qwen2.block_count"], m["qwen2.attention.head_count"]
    kv_heads, width = m["qwen2.attention.head_count_kv"], m["qwen2.embedding_length"]
    assert fit.kv_cache_bytes(info) == 4096 * layers * kv_heads * 2 * (width // heads) * 2
    model = library.import_model("t", tiny.target_gguf).target
    assert fit.need_bytes([model]) == model.size + fit.SCRATCH + fit.kv_cache_bytes(info)

    gib = 1 << 30
    assert fit.verdict(1 * gib, fit.FreeMemory(vram=2 * gib, ram=8 * gib)) == "fits in VRAM"
    assert fit.verdict(3 * gib, fit.FreeMemory(vram=2 * gib, ram=8 * gib)) == "fits in RAM"
    assert fit.verdict(3 * gib, fit.FreeMemory(vram=None, ram=8 * gib)) == "fits in RAM"
    assert fit.verdict(9 * gib, fit.FreeMemory(vram=2 * gib, ram=8 * gib)) == "too big"
    assert fit.verdict(1 * gib, fit.FreeMemory(None, None)) == "unknown"
    assert fit.verdict(None, fit.FreeMemory(2 * gib, 8 * gib)) == "unknown"

    # Free VRAM comes from nvidia-smi when there is one (the GPU with the most free memory).
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 1024\necho 20480\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert fit.free_vram() == 20480 << 20
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert fit.free_vram() is None


def test_registry_exact_lookup_and_unknown_name_lists_known():
    pair = registry.lookup("qwen2.5-coder-1.5b")
    assert registry.DEFAULT_MODEL == pair.name
    assert pair.target.files == ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",)
    assert pair.torch_draft == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert len(registry.lookup("qwen2.5-coder-7b").target.files) == 2
    assert set(registry.known_names()) == {"qwen2.5-coder-1.5b", "qwen2.5-coder-7b", "qwen2.5-7b",
                                           "llama-3.1-8b"}
    with pytest.raises(LocalspecError) as err:
        registry.lookup("Qwen2.5-Coder-1.5B")              # exact: no case folding
    assert all(name in err.value.cause for name in registry.known_names())


def test_generate_with_an_imported_name(data, tiny):
    assert cli(data, "import", "tiny", str(tiny.target_gguf), "--draft",
               str(tiny.draft_gguf)).returncode == 0
    proc = cli(data, "generate", "hi", "--model", "tiny", "--json", "--max-tokens", "4", "--ctx", "512")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["tokens"]) == 4
    assert "gguf-draft" in {s["name"] for s in out["stats"]["stages"]}   # the registered draft


def test_generate_with_an_unknown_name_lists_installed(data, tiny):
    library.import_model("tiny", tiny.target_gguf)
    proc = cli(data, "generate", "hi", "--model", "qwen2.5-coder-7b")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not installed" in proc.stderr and "installed: tiny" in proc.stderr
    assert "localspec pull qwen2.5-coder-7b" in proc.stderr and "localspec import" in proc.stderr


def test_the_default_context_fits_the_free_memory_up_to_the_trained_length(tiny):
    """--ctx left out: the largest multiple of FIT_STEP whose KV cache takes at most FIT_SHARE of
    what the weights leave free where the model runs, capped at the trained context, never below
    the old default (or the trained context, if smaller); and a session opens with it."""
    from localspec.engine.options import Options
    from localspec.engine.session import Session
    from localspec.models import fit
    from localspec.models.gguf_file import read_gguf

    info = read_gguf(tiny.target_gguf)
    trained = fit.trained_context(info)
    per_token = fit.kv_cache_bytes(info, 1)
    gib = 1 << 30
    plenty = fit.FreeMemory(vram=None, ram=64 * gib)
    assert fit.fitted_context(info, 1000, on_gpu=False, free=plenty) == trained
    # a 32k-trained model of this shape where RAM holds the weights and ~10,000 tokens of cache
    long = dataclasses.replace(info, metadata={**info.metadata, "qwen2.context_length": 32768})
    room = int(10_000 * per_token / fit.FIT_SHARE) + fit.SCRATCH + 1000
    got = fit.fitted_context(long, 1000, on_gpu=False, free=fit.FreeMemory(vram=None, ram=room))
    assert got == 9 * fit.FIT_STEP
    assert fit.fitted_context(long, 1000, on_gpu=True, free=fit.FreeMemory(vram=room, ram=1)) == got
    assert fit.fitted_context(long, 1000, on_gpu=False, free=fit.FreeMemory(vram=None, ram=1)) == fit.CONTEXT
    assert fit.fitted_context(long, 1000, on_gpu=False, free=fit.FreeMemory(None, None)) == fit.CONTEXT
    # q8_0 cells (34 bytes a 32 values against 64): the same room holds 1.88x the tokens
    q8 = fit.fitted_context(long, 1000, on_gpu=False, free=fit.FreeMemory(vram=None, ram=room), kv_type="q8_0")
    assert q8 == 18 * fit.FIT_STEP
    session = Session(Options(tiny.target_gguf, speculation=False, n_threads=1))
    try:
        assert session.model.n_ctx == session.cfg.n_ctx == fit.fitted_context(info, 0, False) == trained
    finally:
        session.close()
