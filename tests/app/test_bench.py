"""`localspec bench` on the tiny real models: every configuration runs side by side, the
"identical" column is each configuration's tokens compared with plain decoding's, and HumanEval
pass@1 runs the package's own tests on the completions."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from localspec.app import bench
from localspec.app.humaneval_check import pass_at_1, truncate
from localspec.app.workloads import Prompt, humaneval_problems
from localspec.engine.config import SamplingParams, TreeBudget
from localspec.engine.session import Session
from localspec.models.ngram_store import NgramStore, vocab_key
from localspec.engine.options import Options
from tiny_models import held_out_corpus


@pytest.fixture(scope="module")
def tiny_prompts(tiny):
    session = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    try:
        docs = held_out_corpus(8)
        return [Prompt(f"doc{i}", tuple(session.raw_prompt(d[:80]))) for i, d in enumerate(docs[:4])]
    finally:
        session.close()


@pytest.fixture
def tiny_store(tiny, tmp_path):
    """A scratch n-gram store learnt from held-out documents (the `ngram` stage's source)."""
    store = NgramStore.open(vocab_key(tiny.target_gguf), tmp_path / "ngrams.sqlite")
    session = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    for i, doc in enumerate(held_out_corpus(60)[10:]):
        store.add("file", f"doc{i}", session.raw_prompt(doc))
    session.close()
    yield store
    store.close()


def test_all_configurations_side_by_side_with_identity_computed(tiny, tiny_prompts, tiny_store, tiny_head,
                                                               monkeypatch):
    from localspec.engine.llama_model import LlamaModel

    hidden_at_decode: set[tuple[bool, bool]] = set()   # (a head configuration's?, hidden states on?)
    decode = LlamaModel.decode

    def watched(self, *args, **kwargs):
        if self.path == tiny.target_gguf and current[0] is not None:   # past loading
            hidden_at_decode.add((current[0], self.hidden))
        return decode(self, *args, **kwargs)

    current: list[bool | None] = [None]   # the configuration running: with the head or not
    original_set = LlamaModel.set_hidden

    def set_hidden(self, on):
        current[0] = on
        original_set(self, on)

    monkeypatch.setattr(LlamaModel, "decode", watched)
    monkeypatch.setattr(LlamaModel, "set_hidden", set_hidden)
    report = bench.run_bench(tiny.target_gguf, tiny.draft_gguf, tiny_prompts, list(bench.CONFIGS),
                             24, SamplingParams(), 512, store=tiny_store, head=tiny_head)
    # the configurations without the head decode as a target without one would: no hidden states
    assert (False, False) in hidden_at_decode and (True, True) in hidden_at_decode
    assert (False, True) not in hidden_at_decode
    rows = {r["config"]: r for r in report["rows"]}
    assert list(rows) == list(bench.CONFIGS)
    n = len(tiny_prompts)
    for name, row in rows.items():
        assert row["identical"] == f"{n}/{n}", (name, row)   # greedy on F32 tiny models: exact
        assert row["tokens"] > 0 and row["tok_s"] > 0 and row["speedup"] > 0
        assert row["tokens_per_call"] >= rows["plain"]["tokens_per_call"] > 0
        assert "pass_at_1" not in row                          # these prompts carry no problem
    assert rows["plain"]["speedup"] == 1.0 and rows["plain"]["stages"] == {}
    assert set(rows["staged"]["stages"]) == {"maxgram", "personal-ngram", "gguf-draft"}
    assert set(rows["head"]["stages"]) == {"head"} and sum(rows["head"]["stages"]["head"]["accepted_by_depth"]) > 0
    assert report["head"]["file"] == tiny_head.name and report["head"]["step_ms"]
    assert report["head"]["numerics"] in ("float32", "bfloat16", "int8 weights")   # what the load picked
    ngram = rows["ngram"]["stages"]["personal-ngram"]
    assert sum(ngram["proposed_by_depth"]) > 0 and sum(ngram["accepted_by_depth"]) > 0
    assert len(ngram["accepted_by_depth"]) == len(ngram["proposed_by_depth"])
    assert ngram["rounds"] > 0 and ngram["propose_seconds"] > 0   # where the proposing time went


def test_pytorch_draft_runs_every_draft_configuration(tiny, tiny_prompts, tiny_store):
    """A transformers folder as the draft runs in PyTorch (the GPU's draft runtime): same outputs
    as plain, its own stage name, and its forward times as the adaptive budget's draft curve."""
    names = ["plain", "draft-linear", "draft-tree", "adaptive"]
    report = bench.run_bench(tiny.target_gguf, tiny.draft_torch, tiny_prompts, names, 24,
                             SamplingParams(), 512, store=tiny_store, check=False)
    rows = {r["config"]: r for r in report["rows"]}
    n = len(tiny_prompts)
    assert report["draft_runtime"].startswith("pytorch cpu")
    for name in names[1:]:
        assert rows[name]["identical"] == f"{n}/{n}", (name, rows[name])
    torch_stage = rows["draft-linear"]["stages"]["torch-draft"]
    assert sum(torch_stage["accepted_by_depth"]) > 0
    assert set(report["calibration"]["draft_ms"]) == {1, 2, 4, 8}
    assert all(ms > 0 for ms in report["calibration"]["draft_ms"].values())


def test_identical_counts_what_matches_plain(tiny, tiny_prompts):
    """At T=0.8 speculative runs draw differently from plain: 'identical' must say so, not assume."""
    report = bench.run_bench(tiny.target_gguf, tiny.draft_gguf, tiny_prompts, ["plain", "draft-tree"],
                             24, SamplingParams(temperature=1.5, seed=3), 512, check=False)
    row = next(r for r in report["rows"] if r["config"] == "draft-tree")
    same, total = map(int, row["identical"].split("/"))
    assert total == len(tiny_prompts) and same < total



def test_a_configuration_missing_a_stage_is_skipped_with_what_it_needs(tiny, tiny_prompts):
    lines = []
    report = bench.run_bench(tiny.target_gguf, None, tiny_prompts[:1], ["plain", "maxgram", "adaptive", "ngram"],
                             8, SamplingParams(), 512, check=False, progress=lines.append)
    assert [r["config"] for r in report["rows"]] == ["plain", "maxgram"]
    assert "skipped adaptive: it needs an n-gram store (--learn) and a draft model (--draft)" in lines
    assert "skipped ngram: it needs an n-gram store (--learn)" in lines


def test_pass_at_1_runs_the_problem_tests():
    problems = humaneval_problems()[:2]
    good = [p["canonical_solution"] + "\n\ndef unrelated():\n    pass\n" for p in problems]
    assert truncate(good[0]) == problems[0]["canonical_solution"] + "\n"
    assert pass_at_1(problems, good, {}) == 2
    wrong = ["    return None\n", problems[1]["canonical_solution"]]
    assert pass_at_1(problems, wrong, {}) == 1


def test_bench_command_writes_table_json_and_learns_a_scratch_store(tiny, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, doc in enumerate(held_out_corpus(30)):
        (corpus / f"doc{i}.py").write_text(doc)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.app.cli", "bench", "--model", str(tiny.target_gguf),
         "--draft", str(tiny.draft_gguf), "--workload", "humaneval", "--limit", "2",
         "--max-tokens", "12", "--ctx", "1024", "--configs", "plain,ngram,staged,adaptive-4",
         "--learn", str(corpus), "--threads", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pass@1" in proc.stdout and "staged" in proc.stdout
    report = json.loads((out / "bench.json").read_text())
    assert [r["config"] for r in report["rows"]] == ["plain", "ngram", "staged", "adaptive-4"]
    assert all(r["pass_at_1"].endswith("/2") for r in report["rows"])
    assert report["ngram_source"].startswith("30 files")
    assert report["machine"]["threads"] == 1     # --threads reached the models
    texts = json.loads((out / "completions.json").read_text())   # the text each configuration wrote
    assert [t["prompt"] for t in texts] == ["HumanEval/0", "HumanEval/1"]
    assert all(set(t) == {"prompt", "plain", "ngram", "staged", "adaptive-4"} for t in texts)
    assert all(isinstance(t[c], str) for t in texts for c in t)
    assert "completions" not in report


@pytest.mark.parametrize("flag", ["--limit", "--learn-max-tokens"])
def test_bench_refuses_a_count_below_one_naming_the_flag(tiny, tmp_path, flag):
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.app.cli", "bench", "--model", str(tiny.target_gguf),
         flag, "0", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"Use {flag} an integer >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_bench_refuses_a_bad_thread_count_naming_the_flag(tiny, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.app.cli", "bench", "--model", str(tiny.target_gguf),
         "--threads", "0", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--threads" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_adaptive_n_names_a_budget_and_bad_names_name_the_choices(tiny, tmp_path):
    assert bench.config("adaptive-8").budget == TreeBudget(max_nodes=8, adaptive=True)
    assert bench.config("adaptive-8").stages == bench.CONFIGS["adaptive"].stages
    assert bench.config("head-16").budget == TreeBudget(max_nodes=16)
    assert bench.config("head-16").stages == ("head",)
    assert bench.config("head-16").draft_limits == bench.CONFIGS["head"].draft_limits
    for bad in ("adaptive-0", "adaptive-x", "linear", "adaptive-copy7", "head-0", "head-65"):
        with pytest.raises(KeyError):
            bench.config(bad)
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.app.cli", "bench", "--model", str(tiny.target_gguf),
         "--configs", "plain,adaptive-0", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "adaptive-0" in proc.stderr and "adaptive-N" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_conversation_workload_runs_each_configuration_fresh_and_with_the_cache_kept(tiny, tmp_path):
    """bench --workload conversation: every configuration three times, turn by turn; the "+cache"
    runs keep the last turn's cache (so prefill less), the "+restart" runs load it from disk, and
    both say the same as the fresh runs; every turn has its time to first token."""
    from localspec.app import bench_conversation

    talks = [("two-turns", ["Write a function that adds 2 to a number.", "Now make it add 3."])]
    report = bench_conversation.run_conversation_bench(
        tiny.target_gguf, None, talks, ["plain", "maxgram"], 24, SamplingParams(), 1024, n_threads=1)
    assert [r["config"] for r in report["rows"]] == ["plain", "plain+cache", "plain+restart", "maxgram",
                                                     "maxgram+cache", "maxgram+restart"]
    assert all(r["identical_turns"] == 2 and r["turns"] == 2 for r in report["rows"])
    first, second = report["turns"]
    for name in ("plain", "maxgram"):
        assert first[name + "+cache"]["reused_tokens"] == 0 == second[name]["reused_tokens"]
        assert second[name + "+cache"]["reused_tokens"] >= first["prompt_tokens"] - 1
        # after a "restart" the snapshot of turn 1 serves turn 2 as the kept cache does
        assert second[name + "+restart"]["reused_tokens"] == second[name + "+cache"]["reused_tokens"]
        assert all(0 < row[name]["ttft_s"] <= row[name]["turn_s"] for row in (first, second))
    table = bench_conversation.format_table(report)
    assert "maxgram+cache" in table and "two-turns" in table
    paths = bench.write_outputs(report, tmp_path, plot=False)
    assert [p.name for p in paths] == ["bench.json", "completions.json"]


def test_the_long_conversation_attaches_source_files_until_16k_tokens():
    from localspec.app.conversations import LONG_TOKENS, long_conversation

    (name, turns), = long_conversation(lambda text: len(text) // 4)
    assert name == "long" and sum(len(t) // 4 for t in turns) >= LONG_TOKENS
    assert all("```python" in t for t in turns)


def test_the_last_conversation_attaches_a_source_file_then_asks_short_questions():
    from localspec.app.conversations import CONVERSATIONS, conversations

    every = conversations(None)
    assert [name for name, _ in every[:-1]] == [name for name, _ in CONVERSATIONS]
    name, turns = every[-1]
    assert name == "attached-file" and "```python\n" in turns[0] and len(turns[0]) > 4000
    assert all(len(turn) < 200 for turn in turns[1:]) and len(turns) == 5
    assert conversations(3) == every[:3]


def test_a_conversation_run_can_be_asked_for_alone(tiny):
    from localspec.app import bench_conversation
    from localspec.engine.errors import LocalspecError

    talks = [("one", ["Write a function that adds 2 to a number."])]
    report = bench_conversation.run_conversation_bench(
        tiny.target_gguf, None, talks, ["plain+cache", "maxgram"], 8, SamplingParams(), 512, n_threads=1)
    assert [r["config"] for r in report["rows"]] == ["plain+cache", "maxgram", "maxgram+cache", "maxgram+restart"]
    with pytest.raises(LocalspecError, match="Unknown conversation run"):
        bench_conversation.run_conversation_bench(tiny.target_gguf, None, talks, ["plain+later"], 8,
                                                  SamplingParams(), 512, n_threads=1)


def test_bench_command_runs_a_conversation_workload(tiny, tmp_path):
    """`bench --workload conversation`: the runs asked for, turn by turn, its table and files (no
    plot: its report is by turn), the n-gram stage learnt from --learn as for prompts."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "doc.py").write_text(held_out_corpus(1)[0])
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.app.cli", "bench", "--model", str(tiny.target_gguf),
         "--workload", "conversation", "--limit", "1", "--max-tokens", "8", "--ctx", "1024",
         "--configs", "plain+cache,adaptive-nomodel+cache", "--learn", str(corpus), "--threads", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "time to first token" in proc.stdout and "adaptive-nomodel+cache" in proc.stdout
    report = json.loads((out / "bench.json").read_text())
    assert [r["config"] for r in report["rows"]] == ["plain+cache", "adaptive-nomodel+cache"]
    assert report["workload"] == "conversation" and report["ngram_source"].startswith("1 files")
    assert len(report["turns"]) == 5 and report["turns"][1]["plain+cache"]["reused_tokens"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "completions.json"]
