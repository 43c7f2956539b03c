"""Multi-turn coding conversations for `localspec bench --workload conversation`, written for
localspec and in no benchmark: a user asks for code, then changes to it, quoting earlier turns,
as a chat with a code assistant goes. Each turn's reply is the model's own (the bench feeds it
back through the chat template), so what a turn costs before its first token is the whole
conversation so far: where keeping the cache between turns pays.

The last conversation attaches one of localspec's source files (~2,000 tokens) and then asks short
questions about it: a reopened code-assistant chat. `conversation-long` attaches localspec's own
source files, one a turn, the way `/file` does,
until the conversation passes ~16,000 tokens (`long_conversation`).
"""
from __future__ import annotations

from importlib import resources

CONVERSATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("inventory", (
        "Write a Python class Inventory that keeps item names and their quantities, with methods "
        "add(name, count), remove(name, count) and total().",
        "remove should raise a ValueError when more items are removed than there are. Show the "
        "whole class again.",
        "Add a method most_stocked(n) that returns the n items with the largest quantities, "
        "largest first.",
        "Now write pytest tests for add, remove and most_stocked, including the ValueError case.",
        "Make the class thread-safe with a lock and show the final version of the whole class.",
    )),
    ("log-parser", (
        "I have web server log lines like '2026-03-04 12:00:01 GET /index.html 200 512'. Write a "
        "function parse_line(line) that returns a dict with date, time, method, path, status and "
        "size.",
        "Lines may be malformed. Make parse_line return None for them instead of raising, and "
        "show the function again.",
        "Write a function summarize(lines) that uses parse_line and returns the number of requests "
        "per status code and the total bytes sent.",
        "Change summarize to also return the five most requested paths.",
        "Put parse_line and summarize together in one module with a main() that reads a log file "
        "given on the command line and prints the summary. Show the whole module.",
    )),
    ("matrix", (
        "Write a small Matrix class in pure Python with a constructor from a list of rows, "
        "__add__, __mul__ for matrix multiplication, and __repr__.",
        "Add a transpose() method and a classmethod identity(n). Show the whole class.",
        "Multiplication of matrices with wrong shapes should raise a ValueError with a clear "
        "message. Update __mul__.",
        "Add a determinant() method using Gaussian elimination with partial pivoting.",
        "Write a short example script that builds two matrices, multiplies them, transposes the "
        "result and prints its determinant.",
    )),
)

# the files the long conversation attaches, one a turn, and what each turn asks of it
_LONG_FILES = ("decode.py", "target.py", "policy.py", "budget.py", "calibrate.py", "build.py",
               "llama_model.py", "drafters/ngram.py", "drafters/head.py")   # in localspec.engine
_LONG_ASK = "Here is {name}. Summarise what it does in a few sentences, then name one thing you would change."
LONG_TOKENS = 16_000   # about where the long conversation's last prompt ends (the length)


# a code assistant's usual chat: one file attached (about 2,000 tokens with its first reply), then
# short questions about it; its later turns are what reopening such a conversation costs
_ATTACHED_FILE = "budget.py"
_ATTACHED_ASK = ("Here is {name}. Explain in a few sentences what it decides and from which "
                 "measurements.")
_ATTACHED_FOLLOW_UPS = (
    "Which of its functions would you test first, and why?",
    "Write one pytest test for that function.",
    "Is there a name in the file you would change? Say which and to what.",
    "Summarise our conversation in three bullet points.",
)


def conversations(limit: int | None) -> list[tuple[str, list[str]]]:
    """CONVERSATIONS, then one that attaches a file (a code assistant's chat); `limit` caps how
    many."""
    code = resources.files("localspec.engine").joinpath(_ATTACHED_FILE).read_text(encoding="utf-8")
    attached = (_ATTACHED_ASK.format(name=f"engine/{_ATTACHED_FILE}") + f"\n\n```python\n{code}```",
                *_ATTACHED_FOLLOW_UPS)
    every = [(name, list(turns)) for name, turns in CONVERSATIONS] + [("attached-file", list(attached))]
    return every[:limit]


def long_conversation(count_tokens, limit: int | None = None) -> list[tuple[str, list[str]]]:
    """One conversation whose turns attach localspec's source files until its messages pass
    LONG_TOKENS (by `count_tokens`, text -> tokens; the replies add more); `limit` caps its turns."""
    root = resources.files("localspec.engine")
    turns, total = [], 0
    for name in _LONG_FILES[:limit]:
        code = root.joinpath(name).read_text(encoding="utf-8")
        turns.append(_LONG_ASK.format(name=f"engine/{name}") + f"\n\n```python\n{code}```")
        total += count_tokens(turns[-1])
        if total >= LONG_TOKENS:
            break
    return [("long", turns)]
