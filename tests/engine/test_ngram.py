"""Personal n-gram drafter and its store: exact back-off probabilities, the tree it proposes,
exact forgetting, crash safety under SIGKILL, the size cap, and the `localspec ngram` CLI.
Real SQLite files in tmp_path; the tiny GGUF only where a tokenizer is needed."""
from __future__ import annotations

import math
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from localspec.engine.config import SamplingParams
from localspec.engine.drafters.ngram import NgramLimits, PersonalNgram, _Counts
from localspec.engine.tree import DraftTree
from localspec.models.ngram_store import NgramStore, learn, store_path, vocab_key

SEQ = [1, 2, 3, 1, 2, 4, 1, 2, 3]   # the hand-made corpus of (a) and (b)


def rows(path: Path, source_name: str | None = None) -> set[tuple]:
    """(context, next, count) rows, summed over sources (or of one source)."""
    with sqlite3.connect(path) as db:
        if source_name is None:
            q = "SELECT context, next, SUM(count) FROM ngrams GROUP BY context, next"
            return set(db.execute(q))
        q = ("SELECT context, next, count FROM ngrams JOIN sources ON sources.id = ngrams.source "
             "WHERE sources.name = ?")
        return set(db.execute(q, (source_name,)))


def tree_paths(tree: DraftTree) -> list[tuple[list[int], float]]:
    return [(tree.path_tokens(i), float(tree.logp[i])) for i in range(1, tree.n)]


@pytest.fixture
def store(tmp_path):
    s = NgramStore.open("test-vocab", path=tmp_path / "s.sqlite", max_n=3)
    yield s
    s.close()


# ---- (a) probabilities --------------------------------------------------------------------------
def test_witten_bell_backoff_probabilities(store):
    """Unigrams 1:3 2:3 3:2 4:1 (N=9); after (2): {3:2, 4:1}; after (1,2): {3:2, 4:1}.
    P(w|h) = (c(h,w) + T(h) P(w|h')) / (c(h) + T(h))."""
    store.add("conversation", "c", SEQ)
    drafter = PersonalNgram(store, NgramLimits(max_n=3))
    drafter.begin([])          # no in-session counts: the store's alone
    uni = {1: Fraction(3, 9), 2: Fraction(3, 9), 3: Fraction(2, 9), 4: Fraction(1, 9)}
    big = {t: (Fraction({3: 2, 4: 1}.get(t, 0)) + 2 * uni[t]) / 5 for t in uni}   # h' = (2)
    tri = {t: (Fraction({3: 2, 4: 1}.get(t, 0)) + 2 * big[t]) / 5 for t in uni}   # h = (1, 2)
    assert tri[3] == Fraction(134, 225) and tri[4] == Fraction(67, 225)
    for t, p in tri.items():
        assert drafter.probability([7, 1, 2], t) == pytest.approx(float(p), abs=1e-12)
    # an unseen longest context passes the shorter one through; unseen everywhere -> unigram
    assert drafter.probability([9, 2], 3) == pytest.approx(float(big[3]), abs=1e-12)
    assert drafter.probability([9], 1) == pytest.approx(3 / 9)
    assert sum(drafter.probability([1, 2], t) for t in uni) == pytest.approx(1.0)
    assert store.continuations([1, 2]) == [(3, {3: 2, 4: 1}), (2, {3: 2, 4: 1}),
                                           (1, {1: 3, 2: 3, 3: 2, 4: 1})]


def test_session_counts_add_to_store_counts(store):
    store.add("conversation", "c", SEQ)
    both = PersonalNgram(store, NgramLimits(max_n=3))
    both.begin(SEQ)                       # the same text in memory: every count doubles
    p2 = (4 + 2 * 4 / 18) / 8                  # (2): {3: 4, 4: 2}, c = 6, T = 2
    assert both.probability([1, 2], 3) == pytest.approx((4 + 2 * p2) / 8)
    alone = PersonalNgram(None, NgramLimits(max_n=3))
    alone.begin(SEQ[:5])                  # 1 2 3 1 2: learns from the conversation itself
    alone.accept([4])
    assert alone.probability([1, 2], 3) == pytest.approx((1 + 2 * (1 + 2 * 1 / 6) / 4) / 4)


def test_counts_order_stays_sorted_under_bumps():
    rng = random.Random(0)
    counts = _Counts({t: rng.randint(1, 5) for t in range(30)})
    for _ in range(500):
        counts.bump(rng.randint(0, 40))
        got = [counts.count[t] for t in counts.order]
        assert got == sorted(got, reverse=True)
        assert all(counts.order[i] == t for t, i in counts.pos.items())
        assert counts.total == sum(counts.count.values())


# ---- (b) the proposed tree ----------------------------------------------------------------------
def propose(drafter, root: int, budget: int, sampling=SamplingParams()) -> DraftTree:
    tree = DraftTree(64)
    tree.reset(root)
    drafter.propose(tree, 2, budget, sampling, np.random.default_rng(0))
    return tree


def test_tree_best_first_with_budget_branching_depth_threshold(store):
    store.add("conversation", "c", SEQ)
    drafter = PersonalNgram(store, NgramLimits(max_n=3, branching=2, max_depth=3, threshold=0.1))
    drafter.begin([1, 2])
    tree = propose(drafter, 2, budget=4)
    paths = [p for p, _ in tree_paths(tree)]
    # P(3|1,2) > P(4|1,2) > 0.1 > P(1|1,2): most probable first; then 3's line beats 4.
    assert paths == [[3], [3, 1], [3, 1, 2], [4]]
    assert tree.children[0] == [1, 4]
    for i in range(1, tree.n):      # node logp = sum of the back-off log probabilities
        hist, expect = [1, 2], 0.0
        for tok in tree.path_tokens(i):
            expect += math.log(drafter.probability(hist, tok))
            hist.append(tok)
        assert tree.logp[i] == pytest.approx(expect)
        assert tree.drafter[i] == 2 and tree.proposal[i] is None
    assert max(tree.depth[:tree.n]) == 3
    full = propose(drafter, 2, budget=50)        # depth caps it: 3, 3 1, 3 1 2, 4, 4 1, 4 1 2
    assert sorted(p for p, _ in tree_paths(full)) == [[3], [3, 1], [3, 1, 2], [4], [4, 1],
                                                     [4, 1, 2]]
    assert all(len(full.children[i]) <= 2 for i in range(full.n))
    # sampling mode: the same deterministic children
    assert tree_paths(propose(drafter, 2, 4, SamplingParams(temperature=0.8))) == tree_paths(tree)
    # a higher threshold keeps only the confident line
    strict = PersonalNgram(store, NgramLimits(max_n=3, branching=2, max_depth=3, threshold=0.5))
    strict.begin([1, 2])
    assert [p for p, _ in tree_paths(propose(strict, 2, 8))] == [[3], [3, 1], [3, 1, 2]]


def test_only_likely_nodes_query_the_store(store):
    store.add("conversation", "c", SEQ)
    queried: list[list] = []
    lookup = store.lookup
    store.lookup = lambda contexts: queried.append(list(contexts)) or lookup(contexts)
    limits = dict(max_n=3, branching=2, max_depth=3, threshold=0.1)
    every = PersonalNgram(store, NgramLimits(**limits, fetch_above=1e-9))
    every.begin([1, 2])
    queried.clear()
    deep = propose(every, 2, budget=50)
    assert len(queried) >= 2, "each new context of the tree is a query"
    root_only = PersonalNgram(store, NgramLimits(**limits, fetch_above=1.0))
    root_only.begin([1, 2])
    queried.clear()
    shallow = propose(root_only, 2, budget=50)
    assert len(queried) == 1, "only the root (path probability 1) queries"
    first = sorted((p, lp) for p, lp in tree_paths(shallow) if len(p) == 1)
    assert first == sorted((p, lp) for p, lp in tree_paths(deep) if len(p) == 1), \
        "the root's children are the same"
    # a context skipped for a query is not remembered as empty: a later lookup still fetches it
    for hist, token in (([2, 3], 1), ([3, 1], 2), ([2, 4], 1)):
        assert root_only.probability(hist, token) == pytest.approx(every.probability(hist, token))
    with pytest.raises(ValueError, match="fetch_above"):
        NgramLimits(fetch_above=0.0)


def test_adopts_earlier_stage_children_and_learns_in_session():
    drafter = PersonalNgram(None, NgramLimits(max_n=3, branching=1, max_depth=4))
    drafter.begin([5, 6, 7, 8, 5, 6, 7, 8, 5])
    tree = DraftTree(16)
    tree.reset(5)
    tree.add(0, 6, 0.0, 0)                       # an earlier stage proposed 6 already
    drafter.propose(tree, 1, 3, SamplingParams(), np.random.default_rng(0))
    assert [tree.path_tokens(i) for i in range(1, tree.n)] == [[6], [6, 7], [6, 7, 8], [6, 7, 8, 5]]
    assert list(tree.drafter[1:tree.n]) == [0, 1, 1, 1]
    full = DraftTree(16)
    full.reset(5)
    drafter.propose(full, 1, 0, SamplingParams(), np.random.default_rng(0))
    assert full.n == 1                           # no budget, no nodes


def test_propose_is_cheap(tmp_path):
    """Budget 8 on a store of some 100k rows: well under a millisecond once contexts are cached."""
    rng = random.Random(3)
    phrases = [[rng.randrange(20000) for _ in range(rng.randint(3, 9))] for _ in range(3000)]
    text = [t for _ in range(20000) for t in rng.choice(phrases)]
    with NgramStore.open("perf", path=tmp_path / "p.sqlite") as s:
        for i in range(0, len(text), 5000):
            s.add("conversation", f"c{i}", text[i:i + 5000])
        drafter = PersonalNgram(s, NgramLimits(branching=2, max_depth=6))
        drafter.begin(text[:500])
        tree, costs = DraftTree(64), []
        for i in range(500, 700):
            for _ in range(2):          # first call fetches contexts, second is cached
                tree.reset(text[i - 1])
                t0 = time.perf_counter()
                drafter.propose(tree, 0, 8, SamplingParams(), np.random.default_rng(0))
                costs.append(time.perf_counter() - t0)
            drafter.accept([text[i]])
        assert statistics.median(costs[1::2]) < 1e-3, "median cached propose >= 1 ms"
        assert tree.n > 1


# ---- (c), (d) forgetting and wiping -------------------------------------------------------------
def test_forget_removes_exactly_that_source(tmp_path):
    rng = random.Random(1)
    texts = {n: [rng.randrange(50) for _ in range(400)] for n in ("a", "b", "c")}
    full = NgramStore.open("k", path=tmp_path / "full.sqlite")
    without_b = NgramStore.open("k", path=tmp_path / "without.sqlite")
    for name, toks in texts.items():
        full.add("conversation", name, toks)
        if name != "b":
            without_b.add("conversation", name, toks)
    full.add("file", "b", texts["a"])        # same name, other kind: must survive
    without_b.add("file", "b", texts["a"])
    before = full.revision(), full.erasures()
    assert full.forget("conversation", "b") is True
    assert full.forget("conversation", "b") is False
    assert rows(full.path) == rows(without_b.path)
    assert full.continuations(texts["b"][:3]) == without_b.continuations(texts["b"][:3])
    assert full.revision() > before[0] and full.erasures() == before[1] + 1
    assert {(s.kind, s.name) for s in full.info().sources} == {
        ("conversation", "a"), ("conversation", "c"), ("file", "b")}
    # re-adding replaces, never accumulates
    learn(full, "a", texts["c"])
    learn(without_b, "a", texts["c"])
    learn(without_b, "a", texts["c"])
    assert rows(full.path) == rows(without_b.path)
    full.close(), without_b.close()


def test_drafter_drops_forgotten_counts(store):
    store.add("conversation", "secret", [11, 12, 13] * 5)
    drafter = PersonalNgram(store, NgramLimits(max_n=3))
    drafter.begin([10, 11])
    assert [t for _, t in drafter.next_tokens((10, 11))] == [12]
    store.forget("conversation", "secret")
    drafter.begin([10, 11])
    assert drafter.probability([10, 11], 12) == 0.0   # only the session's own 10 11 remain


def test_wipe_empties(store):
    store.add("conversation", "x", SEQ)
    store.add("file", "/notes.txt", SEQ[::-1])
    store.wipe()
    info = store.info()
    assert (info.n_sources, info.n_ngrams, info.sources) == (0, 0, ())
    assert rows(store.path) == set() and store.integrity_ok()
    assert store.continuations([1, 2]) == [(3, {}), (2, {}), (1, {})]


def test_store_file_layout_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    with NgramStore.open("vocab-1") as s:
        assert s.path == store_path("vocab-1") and s.path.parent.parent == tmp_path
        assert s.path.stat().st_mode & 0o077 == 0
    with sqlite3.connect(store_path("vocab-1")) as db:
        assert [r[1] for r in db.execute("SELECT * FROM schema_version ORDER BY version")] == [
            "0001_sources_and_ngrams", "0002_meta"]
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    from localspec.engine.errors import LocalspecError
    with pytest.raises(LocalspecError, match="another vocabulary"):
        NgramStore.open("vocab-2", path=store_path("vocab-1"))
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    with pytest.raises(LocalspecError, match="unusable") as err:
        NgramStore.open("k", path=bad)
    assert "Delete" in err.value.fix


# ---- (e) crash safety ---------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import random, sys
    from localspec.models.ngram_store import NgramStore
    store = NgramStore.open("crash", path=sys.argv[1])
    rng = random.Random(7)
    big = [rng.randrange(3000) for _ in range(int(sys.argv[2]))]
    print("go", flush=True)
    store.add("conversation", "big", big)
    print("done", flush=True)
""")


@pytest.mark.slow
def test_sigkill_during_add_leaves_old_or_new(tmp_path):
    path, n_big = tmp_path / "crash.sqlite", 80_000
    old = [1, 2, 3, 4] * 50
    with NgramStore.open("crash", path=path) as s:
        s.add("conversation", "other", [9, 8, 7] * 30)
        s.add("conversation", "big", old)
    other, old_rows = rows(path, "other"), rows(path, "big")

    def start() -> tuple[subprocess.Popen, float]:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(n_big)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "go"
        return proc, time.monotonic()

    proc, t0 = start()                           # a full run: the new state and its duration
    assert proc.wait(timeout=120) == 0
    duration = time.monotonic() - t0
    new_rows = rows(path, "big")
    assert len(new_rows) > 100_000 and new_rows != old_rows
    hit_mid_write = 0
    for frac in (0.3, 0.5, 0.65, 0.8, 0.9, 0.97):
        with NgramStore.open("crash", path=path) as s:
            s.add("conversation", "big", old)
            s._checkpoint()                      # empty WAL: later frames come from the child
        proc, t0 = start()
        time.sleep(max(0.0, duration * frac - (time.monotonic() - t0)))
        running = proc.poll() is None
        proc.send_signal(signal.SIGKILL)             # no-op if it already finished
        proc.wait(timeout=30)
        proc.stdout.close()
        wal = Path(f"{path}-wal")
        wal_bytes = wal.stat().st_size if wal.exists() else 0
        with NgramStore.open("crash", path=path) as s:
            assert s.integrity_ok()
            got = rows(path, "big")
            assert got in (old_rows, new_rows), f"partial state after kill at {frac:.2f}"
            n_tokens = {x.name: x.n_tokens for x in s.info().sources}["big"]
            assert n_tokens == (len(old) if got == old_rows else n_big)
            assert rows(path, "other") == other
        hit_mid_write += running and wal_bytes > 0 and got == old_rows
    assert hit_mid_write >= 1, "no kill landed inside the write transaction"


# ---- (f) size bound -----------------------------------------------------------------------------
def test_pruning_keeps_rows_under_the_cap(tmp_path):
    rng = random.Random(2)
    with NgramStore.open("k", path=tmp_path / "cap.sqlite", max_rows=1000) as s:
        s.add("conversation", "common", [1, 2, 3] * 200)           # few rows, high counts
        for i in range(5):
            s.add("conversation", f"noise{i}", [rng.randrange(10_000) for _ in range(300)])
            info = s.info()
            assert info.n_ngrams <= 1000
            with sqlite3.connect(s.path) as db:
                assert db.execute("SELECT COUNT(*) FROM ngrams").fetchone()[0] == info.n_ngrams
        assert s.continuations([3, 1, 2])[0] == (4, {3: 199})       # frequent rows survive
        assert s.integrity_ok()


# ---- (g) CLI ------------------------------------------------------------------------------------
def cli(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "localspec.app.cli", "ngram", *args],
                          input=stdin, capture_output=True, text=True, timeout=120, env=env)


def test_cli_show_forget_wipe(tmp_path, monkeypatch):
    assert "No personal n-gram data yet" in cli(tmp_path, "show").stdout
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    with NgramStore.open("cli-key", label="tiny.gguf") as s:
        s.add("conversation", "chat-1", SEQ)
        s.add("conversation", "chat-2", SEQ * 2)
    shown = cli(tmp_path, "show")
    assert shown.returncode == 0, shown.stderr
    for needle in ("tiny.gguf", "2 sources", "chat-1", "chat-2", "18 tokens", "built from"):
        assert needle in shown.stdout, (needle, shown.stdout)

    gone = cli(tmp_path, "forget", "conversation", "chat-1")
    assert gone.returncode == 0 and "Forgot conversation 'chat-1'" in gone.stdout
    assert "chat-1" not in cli(tmp_path, "show").stdout

    bad = cli(tmp_path, "forget", "conversation", "no-such-chat")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "Unknown n-gram source" in bad.stderr and "no-such-chat" in bad.stderr
    assert "fix:" in bad.stderr and "localspec ngram show" in bad.stderr

    kept = cli(tmp_path, "wipe", stdin="n\n")
    assert kept.returncode == 1 and "Nothing wiped" in kept.stdout
    assert "chat-2" in cli(tmp_path, "show").stdout
    wiped = cli(tmp_path, "wipe", "--yes")
    assert wiped.returncode == 0 and "Wiped 1 sources" in wiped.stdout
    assert "nothing yet" in cli(tmp_path, "show").stdout


def test_cli_add_file_with_the_models_tokenizer(tmp_path, tiny):
    from localspec.engine.llama_model import LlamaModel

    notes = tmp_path / "notes.txt"
    notes.write_text("def add(a, b):\n    return a + b\n" * 20)
    done = cli(tmp_path, "add-file", str(notes), "--model", str(tiny.target_gguf))
    assert done.returncode == 0, done.stderr
    model = LlamaModel(tiny.target_gguf, n_ctx=64)
    try:
        expect = model.tokenize(notes.read_text(), special=False, add_bos=False)
    finally:
        model.close()
    key = vocab_key(tiny.target_gguf)
    assert key == vocab_key(tiny.draft_gguf) != vocab_key(tiny.other_vocab_gguf)
    with NgramStore.open(key, path=store_path(key, tmp_path)) as s:
        (src,) = s.info().sources
        assert (src.kind, src.name, src.n_tokens) == ("file", str(notes.resolve()), len(expect))
    shown = cli(tmp_path, "show", "--model", str(tiny.target_gguf))
    assert Path(tiny.target_gguf).name in shown.stdout and "notes.txt" in shown.stdout
    assert cli(tmp_path, "forget", "file", str(notes)).returncode == 0
    missing = cli(tmp_path, "add-file", str(tmp_path / "nope.txt"), "--model", str(tiny.target_gguf))
    assert missing.returncode == 2 and "fix:" in missing.stderr


def test_a_new_context_keeps_the_session_counts_of_the_part_it_starts_with(store):
    """begin() on a conversation's next turn, an edited one and a shorter one (a regenerated
    reply) leaves the session counts and the drafter's probabilities a fresh begin builds."""
    rng = random.Random(3)
    first = [rng.randrange(8) for _ in range(300)]
    for second in (first + [rng.randrange(8) for _ in range(60)],
                   first[:120] + [rng.randrange(8) for _ in range(90)],
                   first[:40]):
        kept = PersonalNgram(store, NgramLimits(max_n=4))
        kept.begin(first)
        kept.accept([1, 2, 3])                    # a reply's tokens, learnt at the next catch_up
        kept._counts((1, 2))                      # merged counts cached, to be dropped where touched
        kept.begin(second)
        fresh = PersonalNgram(store, NgramLimits(max_n=4))
        fresh.begin(second)
        assert kept._tokens == fresh._tokens and kept._session == fresh._session
        for ctx in [(), (1,), (1, 2), tuple(second[-3:]), tuple(second[-2:])]:
            assert kept._counts(ctx).count == fresh._counts(ctx).count
