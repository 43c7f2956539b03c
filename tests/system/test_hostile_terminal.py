"""Hostile input, round two (issue 45): the terminal localspec writes to.

A model's output, an argument or a file name never drives the user's terminal: their control
characters are shown (app/terminal.py), never sent. The tiny model, sampling near-uniformly over
its byte-level vocabulary, emits raw control bytes (ESC, BEL, NUL, BS, ...) within a few dozen
tokens. And the chat screen without a terminal ends at once, naming line mode, instead of
spinning. Each case ends within its subprocess timeout.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from test_hostile_cli import CLI, QUICK_S, assert_clean_error, assert_quiet_success, run_cli

from localspec.app.terminal import printable

# in UTF-8 output: a C0 control but tab and newline, DEL, or a C1 control
RAW_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")
PICTURE = re.compile("[\u2400-\u2421]")
# near-uniform sampling over the whole vocabulary, plain decoding (no calibration first)
NOISE = ["--temperature", "50", "--top-k", "0", "--top-p", "1", "--max-tokens", "120",
         "--no-speculation"]
SEEDS = range(1, 6)   # the first whose output holds a control character is the case


def raw_controls(data: bytes) -> list[bytes]:
    return RAW_CONTROL.findall(data)


def test_generate_shows_the_models_control_characters(tiny):
    """--json holds the text as the model wrote it (JSON escapes controls itself); the streamed
    text is that text, each control shown as its picture."""
    for seed in SEEDS:
        args = ["generate", "hello", "--raw", "--model", str(tiny.target_gguf), *NOISE, "--seed", str(seed)]
        as_json = run_cli(*args, "--json")
        assert_quiet_success(as_json)
        assert raw_controls(as_json.stdout) == []
        text = json.loads(as_json.stdout)["text"]
        if printable(text) != text:
            break
    else:
        pytest.fail("no seed made the tiny model emit a control character")
    streamed = run_cli(*args)
    assert_quiet_success(streamed)
    assert raw_controls(streamed.stdout) == []
    assert streamed.stdout.decode() == printable(text) + "\n"


@pytest.mark.parametrize("command", ["ask", "chat --line"])
def test_ask_and_line_chat_show_control_characters(tiny, command):
    for seed in SEEDS:
        proc = run_cli(*command.split(), "--model", str(tiny.target_gguf), *NOISE, "--seed", str(seed),
                       *(["hello"] if command == "ask" else []), stdin=b"hello\n/quit\n")
        assert_quiet_success(proc)
        assert raw_controls(proc.stdout) == [], proc.stdout
        if PICTURE.search(proc.stdout.decode()):
            return
    pytest.fail("no seed made the tiny model emit a control character")


def test_an_error_shows_the_control_characters_of_an_argument():
    """A missing model's path is quoted in the error: an OSC title sequence in it is shown."""
    proc = run_cli("generate", "hi", "--model", "/nowhere/\x1b]0;pwned\x07\x1b[8m.gguf", timeout=QUICK_S)
    assert_clean_error(proc, "␛]0;pwned␇␛[8m")
    assert raw_controls(proc.stderr) == []


def test_import_and_list_show_the_control_characters_of_a_path(tiny, tmp_path):
    model = tmp_path / "t\x1b[8m\x9b2J.gguf"       # hidden text, then the screen cleared
    model.write_bytes(Path(tiny.target_gguf).read_bytes())
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(tmp_path / "data")}
    for args in (["import", "evil", str(model)], ["list"]):
        proc = run_cli(*args, env=env, timeout=QUICK_S)
        assert_quiet_success(proc)
        assert raw_controls(proc.stdout) == [] and "t␛[8m␛[2J.gguf" in proc.stdout.decode()


def test_calibrate_shows_the_control_characters_of_a_model_name(tiny, tmp_path):
    model = tmp_path / "t\x1b]0;pwned\x07.gguf"
    model.write_bytes(Path(tiny.target_gguf).read_bytes())
    proc = run_cli("calibrate", "--model", str(model), "--ctx", "256", "--threads", "1")
    assert_quiet_success(proc)
    assert raw_controls(proc.stdout) == [] and "target t␛]0;pwned␇.gguf:" in proc.stdout.decode()


# ---- the chat screen without a terminal --------------------------------------------------------
@pytest.mark.parametrize("stdin", [b"hi\n", subprocess.DEVNULL])
def test_chat_screen_without_a_terminal_names_line_mode(stdin):
    """`echo hi | localspec chat`, `localspec chat </dev/null`: spun at 100% CPU writing escape
    codes until killed; now refused at once, nothing written to stdout."""
    proc = subprocess.run([*CLI, "chat", "--ctx", "256"], capture_output=True, timeout=QUICK_S,
                          **({"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}))
    assert_clean_error(proc, "needs a terminal", "stdin and stderr are not", "localspec chat --line")
    assert proc.stdout == b""


def test_chat_screen_drawn_into_a_file_names_line_mode(tmp_path):
    """Keys from a terminal, but stderr (where Textual draws the screen) redirected: the screen
    went into the file and the terminal stayed blank, waiting for keys."""
    master, slave = os.openpty()
    try:
        with open(tmp_path / "log", "wb") as log:
            proc = subprocess.run([*CLI, "chat"], stdin=slave, stdout=slave, stderr=log,
                                  timeout=QUICK_S)
    finally:
        os.close(master)
        os.close(slave)
    assert proc.returncode == 2
    err = (tmp_path / "log").read_text()
    assert "needs a terminal" in err and "stderr is not" in err and "localspec chat --line" in err


def test_chat_screen_with_stdout_redirected_still_opens(tiny, tmp_path):
    """stdout is not where the screen goes: `localspec chat > file` is a working chat."""
    from test_hostile_tui import Terminal

    with open(tmp_path / "out", "wb") as out:
        term = Terminal("--model", str(tiny.target_gguf), "--ctx", "256", stdout=out)
        try:
            assert term.read_until(b"Esc stops a reply"), term.output[-2000:]
            term.proc.send_signal(signal.SIGTERM)
            assert term.proc.wait(timeout=QUICK_S) == 128 + signal.SIGTERM
        finally:
            term.close()
    assert (tmp_path / "out").read_bytes() == b""


# ---- the chat screen ---------------------------------------------------------------------------
@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_chat_screen_shows_the_replys_control_characters(tiny, tmp_path):
    """Textual passes ESC and most other control characters through to the terminal: the reply is
    shown `printable`, the history keeps what the model wrote."""
    from textual.widgets import Markdown
    from tui_support import replied, running_chat, type_and_send, wait_until

    from localspec.app.tui.widgets import MessageView

    async with running_chat(tiny, tmp_path, (100, 30), temperature=50.0, top_k=0, top_p=1.0,
                            max_tokens=120) as (harness, pilot):
        for seed in SEEDS:
            harness.app.settings = replace(harness.app.settings, seed=seed)
            await type_and_send(pilot, harness, "hello")
            await wait_until(pilot, lambda: replied(harness), what="the reply")
            reply = harness.history.messages(harness.chat.conversation.id)[-1].content
            if printable(reply) != reply:
                break
        else:
            pytest.fail("no seed made the tiny model emit a control character")
        view = list(harness.chat.query(MessageView))[-1]
        assert view.query_one(".msg-body", Markdown).source == printable(reply)


@pytest.mark.anyio
async def test_chat_screen_pop_ups_show_control_characters_and_no_markup(tiny, tmp_path, monkeypatch):
    """Issue 45: a pop-up quoting a name or a cause (here the settings' damage, shown at start) is
    shown `printable` and as plain text: an ESC reached the terminal, and "[/x]" in a name ended the
    app with a MarkupError."""
    from textual.app import App
    from tui_support import make_app, ready, wait_until

    from localspec.engine.errors import LocalspecError

    shown: list = []
    harness = make_app(tiny, tmp_path)
    harness.app.startup_notice = LocalspecError("Settings file \x1b]0;x\x07", "'/tmp/[/x]\x1b[8m.json' is bad",
                                                "Fix [b]it[/b]")
    real = App.notify

    def record(app, message, **kw):
        shown.append((message, kw))
        real(app, message, **kw)

    monkeypatch.setattr(App, "notify", record)
    async with harness.app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: ready(harness), what="engine ready")
        await pilot.pause()
    message, kw = shown[0]
    assert message == printable("'/tmp/[/x]\x1b[8m.json' is bad. Fix [b]it[/b]") and "\x1b" not in message
    assert kw["title"] == printable("Settings file \x1b]0;x\x07") and kw["markup"] is False
