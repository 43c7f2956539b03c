"""Hostile input, round two (issue 45): GGUFs of architectures localspec cannot generate text with.

An encoder (BERT), T5's encoder-decoder, a recurrent model (Mamba) or an architecture this
llama.cpp does not know was imported and listed as fitting, and failed at its first run: `import`
and every command that loads a model refuse it from its header (`general.architecture`,
models/architectures.py) within QUICK_S, exit 2 with title/cause/fix, nothing installed.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from test_hostile_cli import QUICK_S, assert_clean_error, run_cli
from test_hostile_gguf import layout

CASES = {"bert": "makes embeddings", "t5": "encoder-decoder", "mamba": "recurrent",
         "rwkv7": "recurrent", "zzzzz": "not one this llama.cpp build can load"}


def with_architecture(data: bytes, arch: str) -> bytes:
    """The tiny target's bytes with `general.architecture` set to `arch`; general.name, the entry
    after it, shrinks or grows by as much, so that the tensor data stays where it was."""
    kv = {key: value_at for key, _, _, value_at in layout(data).kv}
    at, name_at = kv["general.architecture"], kv["general.name"]
    (old_len,) = struct.unpack_from("<Q", data, at)
    (name_len,) = struct.unpack_from("<Q", data, name_at)
    name = data[name_at + 8:name_at + 8 + name_len]
    new_name = (name + b"_" * old_len)[:name_len + old_len - len(arch)]
    assert len(new_name) == name_len + old_len - len(arch)
    return (data[:at] + struct.pack("<Q", len(arch)) + arch.encode() + data[at + 8 + old_len:name_at]
            + struct.pack("<Q", len(new_name)) + new_name + data[name_at + 8 + name_len:])


@pytest.fixture
def data_env(tmp_path) -> dict:
    return dict(os.environ, LOCALSPEC_DATA_DIR=str(tmp_path / "data"))


@pytest.mark.parametrize("arch", list(CASES))
def test_import_refuses_an_architecture_localspec_cannot_run(tiny, tmp_path, data_env, arch):
    path = tmp_path / f"{arch}.gguf"
    path.write_bytes(with_architecture(Path(tiny.target_gguf).read_bytes(), arch))
    proc = run_cli("import", "m", str(path), env=data_env, timeout=QUICK_S)
    assert_clean_error(proc, "Not a text model localspec can run", f"'{arch}'", CASES[arch],
                       "decoder-only text model")
    listed = run_cli("list", env=data_env, timeout=QUICK_S)
    assert listed.returncode == 0 and b"m " not in listed.stdout, listed.stdout


@pytest.mark.parametrize("arch", ["bert", "mamba"])
def test_generate_refuses_it_before_llama_cpp_loads_it(tiny, tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    path.write_bytes(with_architecture(Path(tiny.target_gguf).read_bytes(), arch))
    proc = run_cli("generate", "hi", "--model", str(path), "--max-tokens", "2", timeout=QUICK_S)
    assert_clean_error(proc, "Not a text model localspec can run", CASES[arch])


def test_the_rewrite_keeps_a_runnable_model_runnable(tiny, tmp_path):
    """The helper's file is refused for its architecture alone: the same rewrite to qwen2 runs."""
    path = tmp_path / "qwen2.gguf"
    path.write_bytes(with_architecture(Path(tiny.target_gguf).read_bytes(), "qwen2"))
    proc = run_cli("generate", "hi", "--raw", "--model", str(path), "--max-tokens", "2", "--no-speculation")
    assert proc.returncode == 0, proc.stderr.decode()


def test_list_marks_an_installed_model_that_cannot_run(tiny, tmp_path, data_env):
    """A model installed before import checked its architecture (here: its file rewritten since)."""
    path = tmp_path / "m.gguf"
    path.write_bytes(Path(tiny.target_gguf).read_bytes())
    assert run_cli("import", "m", str(path), env=data_env, timeout=QUICK_S).returncode == 0
    path.write_bytes(with_architecture(path.read_bytes(), "bert"))
    listed = run_cli("list", env=data_env, timeout=QUICK_S)
    assert listed.returncode == 0 and b"cannot run" in listed.stdout, listed.stdout
