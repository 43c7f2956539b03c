"""`localspec pull` against a hub on 127.0.0.1 (tests/hub_server.py), through the real
huggingface_hub client pointed there with HF_ENDPOINT. Each pull runs as its own process, as a
user's would: the client reads HF_ENDPOINT and the offline switch once, at import.

What they show: a known name installs a verified pair that generates (and pulling it again is a
no-op); a dropped connection, a Ctrl-C and a kill -9 all resume with a Range request; a corrupted
byte is caught and nothing installed; unknown repos, files and names fail clearly; file names that
would leave the store are refused before any request; a draft with another vocabulary is refused
before its download, naming both vocabularies; split models arrive whole; two pulls never write
one file; PyTorch drafts arrive as verified folders whose token texts match the target's; the
library's after-download checks stand on their own.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hub_server import FakeHub
from localspec.engine.errors import LocalspecError
from localspec.models import library

CODER_15 = ("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
CODER_05 = ("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
TINY = "acme/Tiny-GGUF"


@pytest.fixture
def data(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def hub(tiny):
    with FakeHub() as server:
        server.add(CODER_15[0], {CODER_15[1]: Path(tiny.target_gguf)})
        server.add(CODER_05[0], {CODER_05[1]: Path(tiny.draft_gguf)})
        server.add(TINY, {"target.gguf": Path(tiny.target_gguf), "draft.gguf": Path(tiny.draft_gguf),
                          "other-vocab.gguf": Path(tiny.other_vocab_gguf), "README.md": b"# tiny\n"})
        yield server


def env_for(data: Path, hub: FakeHub) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in
           ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_DISABLE_TELEMETRY")}
    return {**env, "LOCALSPEC_DATA_DIR": str(data), "HF_ENDPOINT": hub.endpoint,
            "HF_HOME": str(data.parent / "hf-home")}


def cli(data: Path, hub: FakeHub, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec.app.cli", *args],
                          env=env_for(data, hub), capture_output=True, text=True, timeout=timeout)


def store_files(data: Path) -> list[str]:
    folder = data / "models"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                  and p.name not in (".lock", "manifest.json")) if folder.exists() else []


def manifest(data: Path) -> dict:
    path = data / "models" / "manifest.json"
    return json.loads(path.read_text())["models"] if path.exists() else {}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def refused(proc: subprocess.CompletedProcess, *phrases: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "fix:" in proc.stderr, proc.stderr
    for phrase in phrases:
        assert phrase in proc.stderr, (phrase, proc.stderr)


def test_pull_known_name_installs_a_verified_pair_that_generates(data, hub, tiny):
    done = cli(data, hub, "pull", "qwen2.5-coder-1.5b")
    assert done.returncode == 0, done.stderr
    assert "verified against the hub's hashes" in done.stdout
    assert "share one vocabulary" in done.stderr
    entry = manifest(data)["qwen2.5-coder-1.5b"]
    target, draft = Path(entry["target"]["path"]), Path(entry["draft"]["path"])
    assert target == data / "models" / "qwen2.5-coder-1.5b" / CODER_15[1]
    assert sha256(target) == sha256(tiny.target_gguf) and sha256(draft) == sha256(tiny.draft_gguf)
    assert entry["target"]["owned"] and entry["target"]["source"].startswith(f"hf:{CODER_15[0]}/")
    assert store_files(data) == [f"qwen2.5-coder-1.5b/{CODER_05[1]}", f"qwen2.5-coder-1.5b/{CODER_15[1]}"]
    # The vocabularies were compared from header Range requests before either download.
    first_full = min(i for i, s in enumerate(hub.seen) if s.method == "GET" and "/cdn/" in s.path
                     and s.range is None)
    probes = [s for s in hub.seen[:first_full] if "/cdn/" in s.path
              and s.range and s.range.startswith("bytes=0-")]
    assert {Path(s.path).name for s in probes} == {CODER_15[1], CODER_05[1]}

    # Only the listing, HEAD and GETs of the pair's files: no telemetry, no agent registry.
    assert {s.path.split("/")[1] for s in hub.seen} == {"api", "Qwen", "cdn"}
    assert all(s.path.startswith("/api/models/") for s in hub.seen if s.path.startswith("/api/"))
    listed = cli(data, hub, "list")
    assert listed.returncode == 0 and "qwen2.5-coder-1.5b" in listed.stdout
    assert "fits in" in listed.stdout and "free: VRAM" in listed.stdout
    gen = cli(data, hub, "generate", "hi", "--model", "qwen2.5-coder-1.5b", "--json",
              "--max-tokens", "4", "--ctx", "512")
    assert gen.returncode == 0, gen.stderr
    assert len(json.loads(gen.stdout)["tokens"]) == 4
    served = len(hub.seen)
    again = cli(data, hub, "pull", "qwen2.5-coder-1.5b")            # idempotent: nothing moves
    assert again.returncode == 0 and "already installed" in again.stdout, again.stderr
    assert [s for s in hub.seen[served:] if s.method == "GET" and "/cdn/" in s.path] == []
    refused(cli(data, hub, "pull", f"{TINY}:draft.gguf", "--name", "qwen2.5-coder-1.5b"),
            "already installed", "localspec rm qwen2.5-coder-1.5b")
    assert cli(data, hub, "rm", "qwen2.5-coder-1.5b").returncode == 0
    assert store_files(data) == [] and manifest(data) == {}


def test_dropped_connection_resumes_with_a_range_request(data, hub, tiny):
    hub.fault(TINY, "target.gguf", cut_after=1_000_003)
    done = cli(data, hub, "pull", f"{TINY}:target.gguf", "--name", "t")
    assert done.returncode == 0, done.stderr
    assert [s.range for s in hub.gets("target.gguf")] == [None, "bytes=1000003-"]
    assert sha256(manifest(data)["t"]["target"]["path"]) == sha256(tiny.target_gguf)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_interrupted_pull_resumes_in_the_next_pull(data, hub, tiny, sig):
    fault = hub.fault(TINY, "target.gguf", stall_after=1_234_567)
    proc = subprocess.Popen([sys.executable, "-m", "localspec.app.cli", "pull", f"{TINY}:target.gguf",
                             "--name", "t"], env=env_for(data, hub), stderr=subprocess.PIPE, text=True)
    try:
        assert fault.stalled.wait(120), "the pull never started its download"
        partial = data / "models" / ".downloads" / f"{sha256(tiny.target_gguf)}.partial"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (partial.exists()
                                                   and partial.stat().st_size == 1_234_567):
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        fault.release.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), err
    if sig == signal.SIGINT:
        assert "interrupted" in err and "Traceback" not in err
    kept = partial.stat().st_size
    assert kept == 1_234_567          # every byte that arrived was handed to the OS
    listed = cli(data, hub, "list").stdout
    assert manifest(data) == {} and "No models installed" in listed
    assert "1 unfinished download(s)" in listed

    done = cli(data, hub, "pull", f"{TINY}:target.gguf", "--name", "t")
    assert done.returncode == 0, done.stderr
    assert [s.range for s in hub.gets("target.gguf")] == [None, f"bytes={kept}-"]
    assert sha256(manifest(data)["t"]["target"]["path"]) == sha256(tiny.target_gguf)
    assert not partial.exists() and store_files(data) == ["t/target.gguf"]


def test_a_corrupted_byte_is_caught_and_nothing_is_installed(data, hub, tiny):
    hub.fault(TINY, "target.gguf", corrupt=True)
    proc = cli(data, hub, "pull", f"{TINY}:target.gguf", "--draft", f"{TINY}:draft.gguf")
    refused(proc, "Downloaded file is corrupt", sha256(tiny.target_gguf), "nothing was installed")
    assert manifest(data) == {} and store_files(data) == []     # the bad download is deleted
    hub.faults.clear()                                            # the next pull starts afresh
    assert cli(data, hub, "pull", f"{TINY}:target.gguf", "--draft", f"{TINY}:draft.gguf").returncode == 0
    assert set(manifest(data)) == {"target"}


def test_unknown_repo_file_or_name_fail_clearly(data, hub):
    refused(cli(data, hub, "pull", "acme/Missing-GGUF"), "Repository not found on the hub",
            "acme/Missing-GGUF")
    refused(cli(data, hub, "pull", f"{TINY}:missing.gguf"), "File not found on the hub",
            "'missing.gguf' is not in acme/Tiny-GGUF", "target.gguf", f"localspec pull {TINY}:")
    refused(cli(data, hub, "pull", TINY), "several GGUF models", "draft.gguf, other-vocab.gguf")
    proc = cli(data, hub, "pull", "qwen2.5-coder-9b")
    refused(proc, "Unknown model 'qwen2.5-coder-9b'", "qwen2.5-coder-1.5b", "llama-3.1-8b")
    assert manifest(data) == {} and store_files(data) == []


def test_an_offline_switch_left_on_is_named(data, hub):
    env = {**env_for(data, hub), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "localspec.app.cli", "pull", f"{TINY}:target.gguf"],
                          env=env, capture_output=True, text=True, timeout=300)
    refused(proc, "The hub client is in offline mode", "HF_HUB_OFFLINE")
    assert hub.seen == []


@pytest.mark.parametrize("spec", [f"{TINY}:../../escape.gguf", f"{TINY}:/etc/escape.gguf",
                                  f"{TINY}:sub/../../escape.gguf", "../evil/repo:target.gguf"])
def test_a_file_name_escaping_the_store_is_refused_before_any_request(data, hub, spec):
    proc = cli(data, hub, "pull", spec)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "would leave the model store" in proc.stderr or "Bad hub repository name" in proc.stderr
    assert [s for s in hub.seen if "/api/models" in s.path or "/resolve/" in s.path] == []
    assert not (data.parent / "escape.gguf").exists() and store_files(data) == []


def test_a_hostile_listing_is_refused_before_anything_is_written(data, hub, tiny):
    hub.add("acme/Evil-GGUF", {"model.gguf": Path(tiny.target_gguf)},
            listed_extra=("../../../escape.gguf",))
    proc = cli(data, hub, "pull", "acme/Evil-GGUF")
    refused(proc, "would leave the model store", "../../../escape.gguf")
    assert [s for s in hub.seen if "/resolve/" in s.path] == []
    refused(cli(data, hub, "pull", f"{TINY}:target.gguf", "--name", "../up"), "Bad model name")
    assert not (data.parent / "escape.gguf").exists() and store_files(data) == []


def test_a_draft_with_another_vocabulary_is_refused_before_download(data, hub, tiny):
    proc = cli(data, hub, "pull", f"{TINY}:target.gguf", "--draft", f"{TINY}:other-vocab.gguf")
    refused(proc, "Draft vocabulary does not match the target", "'other-vocab.gguf' has 300 tokens",
            f"'target.gguf' has {tiny.vocab_size} tokens")
    downloads = [s for s in hub.seen if s.method == "GET" and "/cdn/" in s.path
                 and not (s.range or "").startswith("bytes=0-")]
    assert downloads == []                     # only the header probes went out
    assert manifest(data) == {} and store_files(data) == []


def test_the_after_download_vocabulary_check_refuses_and_moves_nothing(data, tiny, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(data))
    staging = library.downloads_dir()
    staging.mkdir(parents=True)
    t, d = staging / "a.gguf", staging / "b.gguf"
    t.write_bytes(Path(tiny.target_gguf).read_bytes())
    d.write_bytes(Path(tiny.other_vocab_gguf).read_bytes())
    with pytest.raises(LocalspecError, match="Draft vocabulary does not match") as err:
        library.install_downloaded("m", library.StagedFile((t,), ("target.gguf",), "hf:x"),
                                   library.StagedFile((d,), ("other-vocab.gguf",), "hf:y"))
    assert "300 tokens" in err.value.cause and "target.gguf" in err.value.cause
    assert library.list_models() == [] and t.exists() and d.exists()


def test_a_failed_manifest_write_moves_downloads_back(data, tiny, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(data))
    staging = library.downloads_dir()
    staging.mkdir(parents=True)
    t = staging / "a.gguf"
    t.write_bytes(Path(tiny.target_gguf).read_bytes())

    def boom(*_):
        raise OSError("disk full")
    monkeypatch.setattr(library, "_write_manifest", boom)
    with pytest.raises(OSError, match="disk full"):
        library.install_downloaded("m", library.StagedFile((t,), ("target.gguf",), "hf:x"), None)
    assert t.exists() and not (data / "models" / "m" / "target.gguf").exists()


def split_part(path: Path, index: int, count: int) -> Path:
    """A later part of a split GGUF as gguf-split writes one: split.* keys and tensors only."""
    import gguf

    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, index)
    writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, count)
    writer.add_int32(gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, 1)
    writer.add_tensor("output.weight", np.arange(4096, dtype=np.float32).reshape(64, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_split_model_arrives_whole_and_leaves_whole(data, hub, tiny, tmp_path):
    part2 = split_part(tmp_path / "p2.gguf", 1, 2)
    hub.add("acme/Split-GGUF", {"m-q4_k_m-00001-of-00002.gguf": Path(tiny.target_gguf),
                                "m-q4_k_m-00002-of-00002.gguf": part2})
    done = cli(data, hub, "pull", "acme/Split-GGUF", "--draft", f"{TINY}:draft.gguf")
    assert done.returncode == 0, done.stderr
    entry = manifest(data)["m-q4_k_m"]["target"]
    assert Path(entry["path"]).name == "m-q4_k_m-00001-of-00002.gguf"
    assert [Path(p).name for p in entry["parts"]] == ["m-q4_k_m-00002-of-00002.gguf"]
    assert entry["size"] == os.path.getsize(tiny.target_gguf) + part2.stat().st_size
    assert "(+1 parts)" in cli(data, hub, "list").stdout
    assert cli(data, hub, "rm", "m-q4_k_m").returncode == 0
    assert store_files(data) == []


@pytest.mark.real_pair
def test_pull_the_reference_pair(data, real_pair):
    """The real Qwen2.5-Coder pair served under its hub names: the 4 MiB header probe reads a
    151,936-token vocabulary, 1.6 GB are verified and installed, and `list` estimates the fit."""
    target, draft = real_pair
    with FakeHub() as server:
        server.add(CODER_15[0], {CODER_15[1]: target})
        server.add(CODER_05[0], {CODER_05[1]: draft})
        done = cli(data, server, "pull", "qwen2.5-coder-1.5b", timeout=1200)
        assert done.returncode == 0, done.stderr
        assert "share one vocabulary (151936 tokens" in done.stderr
        probes = [s.range for s in server.seen if "/cdn/" in s.path
                  and s.range and s.range.startswith("bytes=0-")]
        assert probes == [f"bytes=0-{(4 << 20) - 1}"] * 2
        listed = cli(data, server, "list")
        assert "qwen2.5-coder-1.5b" in listed.stdout and "Q4_K_M" in listed.stdout
        print(done.stdout, done.stderr, listed.stdout, sep="\n")
    entry = manifest(data)["qwen2.5-coder-1.5b"]
    assert entry["target"]["size"] == target.stat().st_size
    assert entry["draft"]["size"] == draft.stat().st_size


def test_a_second_pull_of_the_same_file_waits_its_turn(data, hub, tiny):
    fault = hub.fault(TINY, "target.gguf", stall_after=500_000)
    first = subprocess.Popen([sys.executable, "-m", "localspec.app.cli", "pull", f"{TINY}:target.gguf",
                              "--name", "a"], env=env_for(data, hub), stderr=subprocess.PIPE, text=True)
    try:
        assert fault.stalled.wait(120)
        refused(cli(data, hub, "pull", f"{TINY}:target.gguf", "--name", "b"),
                "Another localspec pull is downloading this file")
    finally:
        fault.release.set()                 # the stalled transfer ends; the first pull resumes
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert set(manifest(data)) == {"a"}
    assert sha256(manifest(data)["a"]["target"]["path"]) == sha256(tiny.target_gguf)


@pytest.mark.parametrize("copy", [False, True])
def test_import_of_a_split_model_takes_every_part(data, tiny, tmp_path, monkeypatch, copy):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(data))
    folder = tmp_path / "mine"
    folder.mkdir()
    first = folder / "m-00001-of-00002.gguf"
    first.write_bytes(Path(tiny.target_gguf).read_bytes())
    with pytest.raises(LocalspecError, match="A part of the split model is missing"):
        library.import_model("m", first)
    second = split_part(folder / "m-00002-of-00002.gguf", 1, 2)
    with pytest.raises(LocalspecError, match="Not the first part"):
        library.import_model("m", second)
    model = library.import_model("m", first, tiny.draft_gguf, copy=copy)
    assert [p.name for p in model.target.files] == [first.name, second.name]
    assert model.target.size == first.stat().st_size + second.stat().st_size
    assert model.target.path.parent == (data / "models" / "m" if copy else folder)
    library.remove_model("m")
    assert first.exists() and second.exists() and store_files(data) == []


# ---- PyTorch drafts: a transformers repo fetched as a folder, token texts checked ----------------
def torch_repo(folder: Path, **replace: bytes) -> dict[str, bytes | Path]:
    files: dict[str, bytes | Path] = {p.name: p for p in folder.iterdir() if p.is_file()}
    files.update({".gitattributes": b"*.safetensors filter=lfs\n", "README.md": b"# draft\n",
                  "onnx/model.onnx": b"not fetched"})
    files.update(replace)
    return files


def test_pull_with_a_pytorch_draft_installs_a_folder_that_generates(data, hub, tiny):
    hub.add("Qwen/Qwen2.5-Coder-0.5B-Instruct", torch_repo(Path(tiny.draft_torch)))
    done = cli(data, hub, "pull", "qwen2.5-coder-1.5b", "--torch-draft")
    assert done.returncode == 0, done.stderr
    assert "both have 512 tokens" in done.stderr
    draft = manifest(data)["qwen2.5-coder-1.5b"]["draft"]
    folder = data / "models" / "qwen2.5-coder-1.5b" / "Qwen2.5-Coder-0.5B-Instruct"
    assert draft["kind"] == "torch" and Path(draft["path"]) == folder
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        p.name for p in Path(tiny.draft_torch).iterdir() if p.is_file())     # no README, onnx
    for name in ("config.json", "model.safetensors", "tokenizer.json"):    # git and LFS files
        assert sha256(folder / name) == sha256(Path(tiny.draft_torch) / name)
    assert "(PyTorch)" in cli(data, hub, "list").stdout
    again = cli(data, hub, "pull", "qwen2.5-coder-1.5b", "--torch-draft")
    assert again.returncode == 0 and "already installed" in again.stdout, again.stderr
    gen = cli(data, hub, "generate", "hi", "--model", "qwen2.5-coder-1.5b", "--json",
              "--max-tokens", "4", "--ctx", "512")
    assert gen.returncode == 0, gen.stderr
    assert "torch-draft" in {s["name"] for s in json.loads(gen.stdout)["stats"]["stages"]}
    assert cli(data, hub, "rm", "qwen2.5-coder-1.5b").returncode == 0
    assert store_files(data) == [] and not folder.exists()


def test_a_pytorch_draft_with_another_vocabulary_is_refused_before_download(data, hub, tiny):
    hub.add("acme/Other-Draft", torch_repo(Path(tiny.other_vocab_torch)))
    proc = cli(data, hub, "pull", f"{TINY}:target.gguf", "--draft", "acme/Other-Draft")
    refused(proc, "Draft vocabulary does not match the target",
            "'acme/Other-Draft' has 300 tokens", f"'target.gguf' has {tiny.vocab_size} tokens")
    assert hub.gets("model.safetensors") == [] and manifest(data) == {} and store_files(data) == []


def test_a_pytorch_draft_numbering_tokens_differently_is_refused_after_download(data, hub, tiny):
    spec = json.loads((Path(tiny.draft_torch) / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]                  # same size, two ids swapped
    hub.add("acme/Twisted-Draft", torch_repo(Path(tiny.draft_torch),
                                             **{"tokenizer.json": json.dumps(spec).encode()}))
    proc = cli(data, hub, "pull", f"{TINY}:target.gguf", "--draft", "acme/Twisted-Draft")
    refused(proc, "Draft vocabulary does not match the target", f"token {min(vocab[a], vocab[b])}",
            "in target 'target.gguf'", "in draft 'Twisted-Draft'")
    assert manifest(data) == {} and store_files(data) == []       # verified files dropped too


def test_import_with_a_pytorch_draft_folder(data, tiny, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(data))
    model = library.import_model("t", tiny.target_gguf, tiny.draft_torch, copy=True)
    assert model.draft.kind == "torch" and model.draft.path == data / "models" / "t" / "draft"
    assert (model.draft.path / "model.safetensors").is_file()
    with pytest.raises(LocalspecError, match="300 tokens"):
        library.import_model("o", tiny.target_gguf, tiny.other_vocab_torch)
    library.remove_model("t")
    assert store_files(data) == [] and Path(tiny.draft_torch, "config.json").is_file()
