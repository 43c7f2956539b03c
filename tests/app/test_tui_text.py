"""The chat's pure text helpers: /file attachments, code blocks, speculation summaries, colours."""
from __future__ import annotations

import pytest

from localspec.app.tui.attach import MAX_FILE_BYTES, code_blocks, expand_attachments
from localspec.app.tui.format import (MIN_PLAIN_ROUNDS, MIN_ROUNDS, engine_line, lead_source,
                                      source_style, speculation_summary, stages_line, vs_plain)
from localspec.engine.errors import LocalspecError


def test_file_lines_become_fenced_blocks(tmp_path):
    (tmp_path / "a.py").write_text("print('hi')\n")
    (tmp_path / "notes.txt").write_text("uses ``` inside\n")
    text = expand_attachments("Look:\n/file a.py\n/file 'notes.txt'\nthanks", cwd=tmp_path)
    assert text == ("Look:\nFile `a.py`:\n```python\nprint('hi')\n```\n"
                    "File `notes.txt`:\n````\nuses ``` inside\n````\nthanks")
    assert expand_attachments("no attachments /file x") == "no attachments /file x"


@pytest.mark.parametrize("make, cause", [
    (lambda d: d / "absent.py", "does not exist"),
    (lambda d: d, "not a regular file"),
    (lambda d: (d / "b.bin").write_bytes(b"ab\0cd") and d / "b.bin", "binary"),
    (lambda d: (d / "big.txt").write_text("x" * (MAX_FILE_BYTES + 1)) and d / "big.txt", "limit"),
])
def test_unreadable_attachments_are_refused_with_the_reason(tmp_path, make, cause):
    path = make(tmp_path)
    with pytest.raises(LocalspecError, match="Cannot attach") as err:
        expand_attachments(f"/file {path}")
    assert cause in err.value.cause and err.value.fix


def test_invalid_utf8_in_an_attachment_becomes_replacement_characters(tmp_path):
    (tmp_path / "l.txt").write_bytes(b"caf\xe9 latin\n")   # the one policy of app/inputs.py
    assert "caf\ufffd latin" in expand_attachments("/file l.txt", cwd=tmp_path)


def test_code_blocks():
    md = "a\n```python\nx = 1\n```\ntext\n~~~\nplain\n~~~\n````md\n```\nnested\n```\n````\n"
    assert code_blocks(md) == ["x = 1", "plain", "```\nnested\n```"]
    assert code_blocks("no code") == []


def test_speculation_summary_and_lines():
    stats = {"tokens": 400, "tokens_per_second": 50.0, "tokens_per_call": 2.5, "plain_tok_s": 25.0,
             "target_calls": MIN_ROUNDS, "plain_rounds": MIN_PLAIN_ROUNDS,
             "stages": [{"name": "maxgram", "proposed": 4, "acceptance": 0.75},
                        {"name": "personal-ngram", "proposed": 0, "acceptance": 0.0}]}
    assert speculation_summary(stats, per_drafter=True) == \
        "50.0 tok/s · 2.50 tok/call · 2.00× vs plain · accepted maxgram 75%"
    # the speed-up waits for enough rounds of the reply and of plain decoding
    assert vs_plain({**stats, "target_calls": MIN_ROUNDS - 1}) == "vs plain …"
    assert vs_plain({**stats, "plain_rounds": MIN_PLAIN_ROUNDS - 1}) == "vs plain …"
    assert vs_plain({k: v for k, v in stats.items() if k != "plain_rounds"}) == "vs plain …"
    assert vs_plain({k: v for k, v in stats.items() if k != "plain_tok_s"}) == ""   # not measured
    assert speculation_summary(stats, brief=True) == "50.0 tok/s · 2.50 tok/call"
    assert speculation_summary({"tokens": 8, "wall_seconds": 2.0}) == "4.0 tok/s"   # a stopped reply
    assert engine_line("/m/t.gguf", "/m/d.gguf", "GPU (X)", 28, "") == \
        "t.gguf + d.gguf · GPU (X), 28 layers offloaded"
    assert engine_line(None, None, None, 0, "starting") == "starting"
    assert stages_line(["maxgram", "gguf-draft"]) == "drafters: maxgram, gguf-draft"
    assert stages_line([]) == "plain decoding"


def test_pieces_take_the_colour_of_their_main_drafter():
    assert lead_source(["target"]) == "target"
    assert lead_source(["maxgram", "maxgram", "target"]) == "maxgram"
    assert lead_source(["gguf-draft", "maxgram", "gguf-draft", "target"]) == "gguf-draft"
    assert source_style("target") == "" and source_style("gguf-draft") == source_style("torch-draft")
