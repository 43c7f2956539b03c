"""What `localspec head train` learns from, and in which order: the text the user names (--text),
their chat history, and the installed Python standard library and site-packages sources, all
offline, all on this machine.

Why this order: --max-tokens stops the reading early (by default after about 2 MB of text), so
what comes first is what the head sees most of. First the text the user named (their own code:
what they asked for), then their conversations (what the chat drafts for), most recent first,
then the standard library and site-packages. Those two are each shuffled and then taken in turn,
one file of each: in path order the reading would stop inside the first packages of the alphabet;
shuffled, it samples all of them; taken in turn, each gets an equal share whatever its size
(a site-packages with PyTorch holds ten times the standard library's code): the standard
library's style, and the code the user's projects import. The shuffles have a fixed seed: the
same sources give the same text, which a resumed checkpoint needs.

Left out of the standard library and site-packages: folders named test or tests (a third of the
standard library's code: asserts, deliberately broken or oddly encoded files, data tables; not
what anyone asks an assistant to write), and a standard library's own site-packages (not the
standard library). Only *.py files are read there.

Each document's place in the reading order is its file id: the held-out split is by file, so a
held-out conversation or file is never trained on.
"""
from __future__ import annotations

import argparse
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from localspec.engine.errors import LocalspecError

from .inputs import read_text_file

# The default --max-tokens reads about 2 MB of text in all; one file many times that is a log or a
# data dump rather than the code and notes a head learns from, and is skipped (with a note)
# instead of being read into memory whole.
HEAD_FILE_MAX_BYTES = 16 << 20
LIBRARY_TEST_DIRS = frozenset({"test", "tests", "idle_test"})   # left out of the standard library and site-packages


@dataclass(frozen=True)
class Choice:
    """Which sources to read: the flags of `head train` (and dev/head_contamination.py)."""
    text: tuple[str, ...] = ()
    history: bool = True
    stdlib: bool = True
    site_packages: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Choice:
        return cls(tuple(args.text or ()), not args.no_history, not args.no_stdlib, not args.no_site_packages)


@dataclass(frozen=True)
class Places:
    """Where the installed sources are: this interpreter's standard library and site-packages
    (a tool install's own environment), and the chat history."""
    stdlib: Path
    site_packages: tuple[Path, ...]
    history: Path

    @classmethod
    def installed(cls) -> Places:
        from .history import history_path

        paths = sysconfig.get_paths()
        site = tuple(dict.fromkeys(Path(paths[k]) for k in ("purelib", "platlib")))
        return cls(Path(paths["stdlib"]), site, history_path())


@dataclass(frozen=True)
class Doc:
    """One document: a file, read when its turn comes, or a conversation's text."""
    label: str
    path: Path | None = None
    text: str = ""

    def read(self) -> str:
        """The text; LocalspecError for a file that is binary, unreadable or too large."""
        if self.path is None:
            return self.text
        return read_text_file(self.path, HEAD_FILE_MAX_BYTES, "Cannot learn from the file", "Split it")


@dataclass(frozen=True)
class Source:
    name: str                 # 'your text', 'chat history', 'standard library', 'site-packages'
    where: str                # its folders, or the history file
    unit: str                 # what a document is: 'files' or 'conversations'
    docs: tuple[Doc, ...]     # in reading order
    in_turn: bool = False     # read one document at a time with the next such source


def add_source_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text", action="append", metavar="PATH",
                   help="files or folders of your own to learn from first (their *.py, *.md, *.txt, *.rst); "
                        "repeatable")
    p.add_argument("--no-history", action="store_true", help="leave out your chat history")
    p.add_argument("--no-stdlib", action="store_true", help="leave out the Python standard library's sources")
    p.add_argument("--no-site-packages", action="store_true", help="leave out site-packages' *.py sources")


def list_sources(choice: Choice, places: Places | None = None) -> list[Source]:
    """The chosen sources in reading order, each with its documents in reading order (the module
    docstring says why). A file is listed once, under the first source that holds it; a --text
    path that does not exist is refused."""
    from localspec.engine.head_train import SKIP_DIRS, text_files   # (numpy: not at the CLI's start)

    places = places or Places.installed()
    library_skip = SKIP_DIRS | LIBRARY_TEST_DIRS
    seen: set[Path] = set()

    def once(files: Iterable[Path]) -> list[Path]:
        out = []
        for f in files:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
        return out

    def shuffled(files: list[Path]) -> tuple[Doc, ...]:
        random.Random(0).shuffle(files)
        return tuple(Doc(str(f), f) for f in files)

    sources = []
    if choice.text:
        missing = [t for t in choice.text if not Path(t).expanduser().exists()]
        if missing:
            raise LocalspecError("Text to learn from not found", ", ".join(missing),
                                 "Check the --text path (a file or a folder)")
        sources.append(Source("your text", ", ".join(choice.text), "files",
                              shuffled(once(text_files(choice.text)))))
    if choice.history:
        sources.append(Source("chat history", str(places.history), "conversations",
                              conversation_docs(places.history)))
    if choice.stdlib:
        sources.append(Source("standard library", str(places.stdlib), "files",
                              shuffled(once(text_files([places.stdlib], (".py",), library_skip))), True))
    if choice.site_packages:
        sources.append(Source("site-packages", ", ".join(map(str, places.site_packages)), "files",
                              shuffled(once(text_files(places.site_packages, (".py",), library_skip))),
                              True))
    return sources


def conversation_docs(history_file: Path) -> tuple[Doc, ...]:
    """Each conversation of the chat history (app/history.py) as one document, most recent
    first: its user and assistant turns as plain text, a blank line apart (empty ones left out).
    No history file yet: none (and none is created)."""
    if not history_file.is_file():
        return ()
    from .history import History

    docs = []
    with History.open(history_file) as history:
        for conv in history.conversations():
            text = "\n\n".join(m.content for m in history.messages(conv.id) if m.content.strip())
            if text:
                docs.append(Doc(f"conversation '{conv.title}' ({conv.id})", text=text))
    return tuple(docs)


def reading_order(sources: Sequence[Source]) -> list[tuple[Source, Doc]]:
    """Every document in the order it is read (its index: its file id): source after source,
    except that consecutive `in_turn` sources give one document each in turn."""
    order: list[tuple[Source, Doc]] = []
    i = 0
    while i < len(sources):
        group = [sources[i]]
        while group[-1].in_turn and i + len(group) < len(sources) and sources[i + len(group)].in_turn:
            group.append(sources[i + len(group)])
        longest = max(len(s.docs) for s in group)
        order += [(s, s.docs[k]) for k in range(longest) for s in group if k < len(s.docs)]
        i += len(group)
    return order


def summary_lines(sources: Sequence[Source], order: Sequence[tuple[Source, Doc]],
                  tokens_per_doc: Sequence[int]) -> list[str]:
    """One line per source, what was read of it: 'standard library (/usr/lib/python3.12): 310 of
    1,894 files, 240,000 tokens'. `tokens_per_doc`: tokens read of each document, by file id."""
    read = {s.name: [0, 0] for s in sources}
    for (source, _), n in zip(order, tokens_per_doc):
        if n > 0:
            read[source.name][0] += 1
            read[source.name][1] += int(n)
    return [summary_line(s, *read[s.name]) for s in sources]


def summary_line(source: Source, docs_read: int, tokens: int) -> str:
    if not source.docs:
        return f"{source.name} ({source.where}): no {source.unit}"
    return f"{source.name} ({source.where}): {docs_read:,} of {len(source.docs):,} {source.unit}, {tokens:,} tokens"
