"""What llama.cpp would assert on (and abort the process for) is refused before calling it, through
the command line: exit status 2, a title/cause/fix message on stderr, no traceback, nothing on
stdout. An abort that still happens prints no debugger backtrace on stdout (engine/native.py)."""
from __future__ import annotations

import json

import os
import subprocess
import sys

import pytest

from localspec.engine.errors import LocalspecError
from localspec.engine.llama_model import MAX_SEQUENCES, LlamaModel


def generate(model, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec.app.cli", "generate", "--model", str(model),
                           "--max-tokens", "2", *args, "def add(a, b):"],
                          capture_output=True, text=True, timeout=120)


def assert_refused(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stdout == ""
    assert "Traceback" not in run.stderr and "GGML_ASSERT" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[-3].startswith("Error: ") and "cause:" in lines[-2] and "fix:" in lines[-1]
    for word in words:
        assert word in run.stderr


@pytest.mark.parametrize("ctx", ["60", "65", "20"])   # the prompt fits ctx*8 bytes (app/inputs.py)
def test_a_context_smaller_than_speculations_sequences_is_refused_with_the_size_that_works(tiny, ctx):
    """Default trees of 32 nodes use 66 sequences (33 paths, 33 padding): llama.cpp aborted below a
    context of 66 (its output buffer holds a row per sequence, at most a context's worth)."""
    run = generate(tiny.target_gguf, "--ctx", ctx)
    assert_refused(run, "Context too small", f"--ctx {ctx}", "Use --ctx 66 or more", "--no-speculation")


def test_the_bound_is_the_one_llama_cpp_needs(tiny):
    """At exactly the bound the run works, with a smaller tree the bound is smaller."""
    assert generate(tiny.target_gguf, "--ctx", "66").returncode == 0
    assert generate(tiny.target_gguf, "--ctx", "22", "--tree-nodes", "10").returncode == 0
    assert_refused(generate(tiny.target_gguf, "--ctx", "21", "--tree-nodes", "10"), "Use --ctx 22 or more")


@pytest.mark.parametrize("ctx", ["-1", str(1 << 40)])
def test_a_context_size_out_of_range_is_refused(tiny, ctx):
    assert_refused(generate(tiny.target_gguf, "--ctx", ctx), f"--ctx {ctx}", "from 0 to 2147483647")


def test_context_zero_is_the_fitted_default(tiny):
    """--ctx 0 is what leaving it out means: the context that fits (models/fit.py), here the tiny
    model's trained length, which a prompt up to it may fill."""
    from localspec.models.fit import trained_context
    from localspec.models.gguf_file import read_gguf

    for flags in (("--ctx", "0"), ()):
        proc = generate(tiny.target_gguf, *flags, "--json")
        assert proc.returncode == 0, proc.stderr
        stats = json.loads(proc.stdout)["stats"]
        assert stats["context_size"] == trained_context(read_gguf(tiny.target_gguf))


def test_the_model_api_refuses_a_context_size_out_of_range(tiny):
    with pytest.raises(LocalspecError, match="Invalid context size"):
        LlamaModel(tiny.target_gguf, n_ctx=0, n_threads=1)


def test_a_tiny_context_without_speculation_runs(tiny):
    """Without speculation one sequence fits any context (llama.cpp rounds its cache up to whole
    blocks); llama.cpp asserted on a prompt batch wider than the context asked for before: prefill
    now goes in batches of its own cap."""
    run = generate(tiny.target_gguf, "--ctx", "2", "--no-speculation")   # 16 bytes: the prompt's 14 pass
    assert run.returncode == 0 and run.stdout.strip(), run.stderr[-2000:]


def test_too_many_sequences_for_llama_cpp_names_the_tree_size_that_fits(tiny):
    """The command line refuses trees past its own range first (engine/options.py); the model API
    refuses what llama.cpp cannot hold."""
    assert_refused(generate(tiny.target_gguf, "--tree-nodes", "100000"), "--tree-nodes 100000", "from 1 to")
    nodes = MAX_SEQUENCES // 2 - 1
    with pytest.raises(LocalspecError, match="Draft trees too large") as err:
        LlamaModel(tiny.target_gguf, n_ctx=4096, n_seq_max=nodes + 2, n_pad_seqs=nodes + 2, n_threads=1)
    assert f"--tree-nodes {nodes} or fewer" in err.value.fix


def test_the_model_api_refuses_before_creating_the_context(tiny):
    with pytest.raises(LocalspecError, match="Context too small") as err:
        LlamaModel(tiny.target_gguf, n_ctx=40, n_seq_max=33, n_pad_seqs=33, n_threads=1)
    assert "--ctx 66" in err.value.fix
    model = LlamaModel(tiny.target_gguf, n_ctx=66, n_seq_max=33, n_pad_seqs=33, n_threads=1)
    try:
        assert model.n_batch <= model.n_ctx   # llama.cpp's own cap: prefill chunks fit it
    finally:
        model.close()


def test_a_llama_cpp_load_failure_shows_its_error_line(tiny, tmp_path):
    """A file the GGUF reader accepts but llama.cpp cannot load (a tensor renamed): the cause is
    llama.cpp's error, not the last lines of its log."""
    data = tiny.target_gguf.read_bytes()
    bad = tmp_path / "renamed.gguf"
    bad.write_bytes(data.replace(b"output_norm.weight", b"output_norx.weight", 1))
    run = generate(bad, "--no-speculation")
    assert_refused(run, "llama.cpp could not load the model", "output_norm.weight")
    cause = run.stderr.strip().splitlines()[-2]
    assert "missing tensor" in cause or "error loading model" in cause, cause


def test_an_abort_inside_ggml_prints_no_backtrace_on_stdout():
    """ggml's abort handler runs gdb on the process where gdb is installed, onto stdout; importing
    the native module switches that off (a user's own GGML_NO_BACKTRACE stays as given)."""
    code = ("import ctypes, sys\n"
            "from localspec.engine import native\n"
            "lib = next(f for f in native.libraries() if f.name.startswith('libggml-base'))\n"
            "sys.stdout.flush()\n"
            "ctypes.CDLL(str(lib)).ggml_abort(b'probe.c', 1, b'%s', b'deliberate abort')\n")
    env = {k: v for k, v in os.environ.items() if k != "GGML_NO_BACKTRACE"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode != 0 and "deliberate abort" in run.stderr
    assert run.stdout == ""


def test_a_ctrl_c_inside_close_frees_nothing_twice(tiny, monkeypatch):
    """A Ctrl+C can land inside `close` (app/exits.py raises a dropped one again shortly after);
    the `close` that `__del__` runs at exit then freed the batch a second time: "double free or
    corruption", an abort where `generate` should have exited 130."""
    import localspec.engine.llama_model as llama_model

    model = LlamaModel(tiny.target_gguf, n_ctx=256)
    freed: list[str] = []
    real = llama_model.lc

    class Interrupting:   # llama.cpp's own functions, with a Ctrl+C after the batch is freed
        def __getattr__(self, name):
            return getattr(real, name)

        def llama_batch_free(self, batch):
            freed.append("batch")
            if freed.count("batch") == 1:   # a second free would abort the test run itself
                real.llama_batch_free(batch)
            raise KeyboardInterrupt

        def llama_free(self, ctx):
            freed.append("context")
            real.llama_free(ctx)

        def llama_model_free(self, m):
            freed.append("model")
            real.llama_model_free(m)

    monkeypatch.setattr(llama_model, "lc", Interrupting())
    with pytest.raises(KeyboardInterrupt):
        model.close()
    try:
        model.close()      # what __del__ does at exit
        model.close()
    except KeyboardInterrupt:
        pass               # only where the batch was freed again, which the assert names
    assert freed == ["batch", "model"], "the context leaks until exit; nothing is freed twice"
