"""What `localspec head train` learns from (app/head_sources.py): the sources each flag leaves
out, their reading order, chat history as texts, the summary of what was read, and the command
reading them (the training itself is tests/engine/test_head.py's)."""
from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from localspec.app.head_sources import Choice, Doc, Places, Source, list_sources, reading_order, summary_lines
from localspec.app.history import History
from localspec.engine.errors import LocalspecError


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def places(tmp_path) -> Places:
    """A standard library and a site-packages with what is read and what is left out."""
    stdlib = _tree(tmp_path / "lib", {"json/__init__.py": "x = 1\n", "abc.py": "y = 2\n", "notes.txt": "no\n",
                                      "test/test_json.py": "assert 1\n", "json/tests/t.py": "assert 2\n",
                                      "site-packages/pkg/mod.py": "not the stdlib\n",
                                      "__pycache__/abc.cpython-311.py": "cached\n"})
    site = _tree(tmp_path / "site", {"pkg/__init__.py": "", "pkg/core.py": "def f():\n    pass\n",
                                     "pkg/tests/test_core.py": "assert f\n", ".hidden/x.py": "hidden\n"})
    return Places(stdlib, (site,), tmp_path / "history.sqlite")


def _names(sources: list[Source]) -> list[str]:
    return [s.name for s in sources]


def _files(source: Source, root: Path) -> set[str]:
    return {str(d.path.relative_to(root)) for d in source.docs}


def test_default_sources_and_the_flags_that_leave_each_out(places, tmp_path):
    mine = _tree(tmp_path / "mine", {"a.py": "a = 1\n", "README.md": "# mine\n", ".venv/lib/x.py": "not mine\n"})
    every = list_sources(Choice((str(mine),)), places)
    assert _names(every) == ["your text", "chat history", "standard library", "site-packages"]
    assert _files(every[0], mine) == {"a.py", "README.md"}               # hidden folders (.venv) left out
    assert _files(every[2], places.stdlib) == {"json/__init__.py", "abc.py"}   # *.py; no tests, site-packages
    assert _files(every[3], places.site_packages[0]) == {"pkg/__init__.py", "pkg/core.py"}
    assert _names(list_sources(Choice(), places)) == ["chat history", "standard library", "site-packages"]
    assert _names(list_sources(Choice(history=False), places)) == ["standard library", "site-packages"]
    assert _names(list_sources(Choice(stdlib=False), places)) == ["chat history", "site-packages"]
    assert _names(list_sources(Choice(site_packages=False), places)) == ["chat history", "standard library"]
    assert list_sources(Choice(history=False, stdlib=False, site_packages=False), places) == []


def test_flags_parse_into_the_choice():
    from localspec.app.cli import build_parser

    def choice(*flags: str) -> Choice:
        return Choice.from_args(build_parser().parse_args(["head", "train", "--model", "m", *flags]))
    assert choice() == Choice()
    assert choice("--text", "a", "--text", "b", "--no-stdlib") == Choice(("a", "b"), stdlib=False)
    assert choice("--no-history", "--no-site-packages") == Choice(history=False, site_packages=False)


def test_the_installed_places_are_this_pythons():
    places = Places.installed()
    assert places.stdlib == Path(sysconfig.get_paths()["stdlib"])
    assert Path(sysconfig.get_paths()["purelib"]) in places.site_packages
    assert places.history.name == "history.sqlite"


def test_a_text_path_that_does_not_exist_is_refused(places, tmp_path):
    with pytest.raises(LocalspecError, match="Text to learn from not found") as err:
        list_sources(Choice((str(tmp_path / "typo"),)), places)
    assert "--text" in err.value.fix


def test_a_file_is_read_once_under_the_first_source_that_holds_it(places):
    sources = list_sources(Choice((str(places.stdlib / "abc.py"),), history=False), places)
    assert _files(sources[0], places.stdlib) == {"abc.py"}
    assert _files(sources[1], places.stdlib) == {"json/__init__.py"}


def test_history_conversations_become_texts_most_recent_first(places):
    assert list_sources(Choice(stdlib=False, site_packages=False), places)[0].docs == ()
    assert not places.history.exists()      # no history yet: none read, none created
    with History.open(places.history) as h:
        old = h.new_conversation("Old")
        h.add_message(old.id, "user", "How do I sort a dict by value?")
        h.add_message(old.id, "assistant", "Use `sorted(d.items(), key=lambda kv: kv[1])`.")
        h.new_conversation("Empty")
        new = h.new_conversation("New")
        h.add_message(new.id, "user", "def add(a, b):")
        reply = h.begin_reply(new.id)
        h.finish_reply(reply.id, "", "stopped")       # an empty reply: left out
        h.add_message(new.id, "user", "and now?")
    (history,) = list_sources(Choice(stdlib=False, site_packages=False), places)
    assert [d.read() for d in history.docs] == [
        "def add(a, b):\n\nand now?",
        "How do I sort a dict by value?\n\nUse `sorted(d.items(), key=lambda kv: kv[1])`."]
    assert history.unit == "conversations" and "'New'" in history.docs[0].label


def test_reading_order_your_text_then_history_then_the_libraries_in_turn():
    def source(name: str, n: int, in_turn: bool = False) -> Source:
        return Source(name, "-", "files", tuple(Doc(f"{name}{i}", text="x") for i in range(n)), in_turn)
    sources = [source("t", 2), source("h", 1), source("s", 3, True), source("p", 1, True)]
    assert [d.label for _, d in reading_order(sources)] == ["t0", "t1", "h0", "s0", "p0", "s1", "s2"]


def test_summary_line_per_source_files_and_tokens():
    a = Source("standard library", "/usr/lib/python3.12", "files", tuple(Doc(f"f{i}", text="x") for i in range(1894)),
               True)
    b = Source("chat history", "/data/history.sqlite", "conversations", ())
    order = [(a, d) for d in a.docs]
    tokens = [0] * len(order)
    tokens[:310] = [1000] * 309 + [10_000]
    assert summary_lines([a, b], order, tokens) == [
        "standard library (/usr/lib/python3.12): 310 of 1,894 files, 319,000 tokens",
        "chat history (/data/history.sqlite): no conversations"]


def test_head_train_reads_your_text_then_history_and_records_them(tiny, tmp_path, monkeypatch, capsys):
    """By default `head train` reads the user's text, then the chat history (the standard library
    and site-packages are left out here to keep the test small), says what it read of each, and
    the head's meta records it."""
    from localspec.app.cli import build_parser
    from localspec.engine import head_train

    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    with History.open() as h:
        conv = h.new_conversation("chat")
        h.add_message(conv.id, "user", "Write a function that adds two numbers. " * 20)
    mine = _tree(tmp_path / "mine", {"a.py": "def add(a, b):\n    return a + b\n" * 40})
    seen = {}

    def train(corpus, model, out, **kwargs):   # the training itself is tests/engine/test_head.py's
        seen.update(sources=sorted(set(corpus.source.tolist())), meta=kwargs["meta"])
        return {"tokens": len(corpus.tokens), "draft_vocab": 4, "held_out_top1": [0.5]}
    monkeypatch.setattr(head_train, "train", train)
    args = build_parser().parse_args(["head", "train", "--model", str(tiny.target_gguf), "--text", str(mine),
                                      "--no-stdlib", "--no-site-packages", "--out", str(tmp_path / "h.npz"),
                                      "--max-tokens", "4000", "--generated-tokens", "0", "--ctx", "128"])
    assert args.run(args) == 0
    err = capsys.readouterr().err
    assert f"read your text ({mine}): 1 of 1 files, " in err
    assert "read chat history (" in err and "): 1 of 1 conversations, " in err
    assert seen["sources"] == [0, 1]       # file ids: your file, then the conversation
    assert [line.split(" (")[0] for line in seen["meta"]["text"]] == ["your text", "chat history"]
