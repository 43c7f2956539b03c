"""What the chat input understands beyond plain text: `/file PATH` attachments and code blocks.

Pure functions over strings and files, so they are tested without a terminal. An attachment that
cannot be read (missing, a folder, binary, too big) is a LocalspecError naming the fix; the
message is then not sent. Invalid UTF-8 follows app/inputs.py's one policy (U+FFFD).
"""
from __future__ import annotations

import re
from pathlib import Path

from localspec.app.inputs import read_text_file
from localspec.engine.errors import LocalspecError

MAX_FILE_BYTES = 128 * 1024     # a file this size already fills a 4k-token context several times
_FILE_LINE = re.compile(r"^/file\s+(.+?)\s*$")
_FENCE = re.compile(r"^(`{3,}|~{3,})([^\n`]*)\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_LANGS = {".py": "python", ".js": "javascript", ".ts": "typescript", ".rs": "rust", ".go": "go",
          ".c": "c", ".h": "c", ".cpp": "cpp", ".hpp": "cpp", ".java": "java", ".sh": "bash",
          ".md": "markdown", ".json": "json", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml",
          ".html": "html", ".css": "css", ".sql": "sql", ".rb": "ruby"}


def expand_attachments(text: str, cwd: Path | None = None) -> str:
    """The message with every `/file PATH` line replaced by that file's text in a fenced block."""
    out: list[str] = []
    for line in text.split("\n"):
        found = _FILE_LINE.match(line.strip())
        out.append(attachment_block(found.group(1), cwd) if found else line)
    return "\n".join(out).strip()


def attachment_block(raw: str, cwd: Path | None = None) -> str:
    path = Path(raw.strip().strip("'\"")).expanduser()
    if not path.is_absolute():
        path = (cwd or Path.cwd()) / path
    if not path.exists():
        raise LocalspecError("Cannot attach the file", f"'{raw}' does not exist",
                             "Check the path (relative paths start where localspec was started)")
    if not path.is_file():
        raise LocalspecError("Cannot attach the file", f"'{raw}' is not a regular file",
                             "Attach one file at a time: /file PATH")
    body = read_text_file(path, MAX_FILE_BYTES, "Cannot attach the file",
                          "Attach the part that matters (copy it into the message)")
    fence = "````" if "```" in body else "```"
    return f"File `{path.name}`:\n{fence}{_LANGS.get(path.suffix.lower(), '')}\n{body.rstrip()}\n{fence}"


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order, without their fences."""
    return [m.group(3).rstrip("\n") for m in _FENCE.finditer(markdown)]
