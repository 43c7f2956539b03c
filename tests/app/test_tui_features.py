"""Pilot tests of the chat's other features: retry and edit-last on the tiny real model; /file,
code-block copy, token colouring, settings, and the first-run screen (scripted engine or none)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from tui_support import (DEMO_REPLY, SPEC, ScriptedEngine, demo_app, demo_history, make_app, replied,
                         running_chat, submit_prompt, type_and_send, wait_until)

from localspec.app.history import History
from localspec.app.cli import build_parser
from localspec.app.engine_proc import Error
from localspec.app.settings import Settings, load_settings, save_settings
from localspec.app.tui.app import ChatApp
from localspec.app.tui.attach import code_blocks
from localspec.app.tui.first_run import FirstRunScreen
from localspec.app.tui.launch import chat_app
from localspec.app.tui.widgets import MessageView
from localspec.models import library
from localspec.engine.options import Options

SIZE = (110, 34)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_retry_and_edit_last(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    async with running_chat(tiny, tmp_path, SIZE) as (h, pilot):
        await type_and_send(pilot, h, "Say hello to Bob.")
        await wait_until(pilot, lambda: replied(h), what="reply")
        (conv,) = h.history.conversations()
        first = h.history.messages(conv.id)[-1]

        await pilot.press("ctrl+r")                           # regenerate the last reply
        await wait_until(pilot, lambda: replied(h), what="retried reply")
        user, again = h.history.messages(conv.id)
        assert again.id != first.id and again.state == "complete" and again.content
        assert len(h.chat.query(MessageView)) == 2

        await pilot.press("ctrl+e")                           # edit the last user message
        prompt = h.chat.query_one("#prompt")
        assert prompt.text == "Say hello to Bob."
        await type_and_send(pilot, h, "Write a function that adds 2 to a number.")
        await wait_until(pilot, lambda: replied(h), what="reply to the edited message")
        rows = h.history.messages(conv.id)
        assert [(m.role, m.state) for m in rows] == [("user", "complete"), ("assistant", "complete")]
        assert rows[0].content == "Write a function that adds 2 to a number."
        assert "def" in rows[1].content


async def test_file_attachment_and_its_errors(tmp_path):
    code = tmp_path / "util.py"
    code.write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01binary")
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        chat = app.chat
        await pilot.press("ctrl+n")
        prompt = chat.query_one("#prompt")
        await submit_prompt(pilot, chat, f"/file {tmp_path / 'missing.py'}\nExplain this")
        notice = chat.query_one("#notice")
        assert notice.display and "does not exist" in str(notice.render())
        assert prompt.text.startswith("/file")                 # kept for the user to fix
        await submit_prompt(pilot, chat, f"/file {tmp_path / 'blob.bin'}")
        assert "binary" in str(notice.render())
        assert len(app.history.conversations()) == 2            # nothing was sent or stored

        await submit_prompt(pilot, chat, f"Explain this\n/file {code}")
        await pilot.pause()
        assert not notice.display
        stored = app.history.messages(chat.conversation.id)[0].content
        assert stored.startswith("Explain this\nFile `util.py`:\n```python\ndef double(x):")
        op, args, kwargs = app.engine.requests[-1]
        assert op == "generate" and args[1] == [{"role": "user", "content": stored}]


async def test_copy_code_block(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+y")
        assert app.clipboard == code_blocks(DEMO_REPLY)[-1]
        assert app.clipboard.startswith("def reverse(s: str) -> str:")
        app.copy_to_clipboard("")
        await submit_prompt(pilot, app.chat, "/copy 1")
        assert app.clipboard.startswith("def reverse")
        await submit_prompt(pilot, app.chat, "/copy 7")
        assert any("1 to 1" in n.message for n in app._notifications)


async def test_token_colouring_toggle(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        reply = app.chat.query(MessageView).last()
        assert reply.query_one(".msg-body").display and not reply.query_one(".msg-sources").display
        await pilot.press("ctrl+t")
        assert app.chat.has_class("-sources")
        coloured = reply.query_one(".msg-sources")
        assert coloured.display and not reply.query_one(".msg-body").display
        spans = " ".join(str(s.style) for s in coloured.render().spans)
        assert all(c in spans for c in ("green", "magenta", "cyan"))   # maxgram, personal, draft
        assert "personal-ngram" in str(app.chat.query_one("#status").render())
        await pilot.press("ctrl+t")
        assert not app.chat.has_class("-sources")


async def submit_settings(pilot, app, values: dict) -> None:
    """Set the open settings form's fields (by id) and save it."""
    for name, value in values.items():
        app.screen.query_one(f"#{name}").value = value
    await pilot.press("ctrl+s")
    await pilot.pause()


async def test_settings_validate_save_atomically_and_restart_the_engine(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first_engine = app.engine
        await pilot.press("ctrl+o")
        form = app.screen
        form.query_one("#temperature").value = "-3"
        await pilot.press("ctrl+s")
        assert app.screen is form and "temperature" in str(form.query_one("#settings-error").render())
        form.query_one("#temperature").value = "0.5"
        form.query_one("#system_prompt").text = "Answer in one line."
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is app.chat
        saved = load_settings(tmp_path / "settings.json")
        assert (saved.temperature, saved.system_prompt) == (0.5, "Answer in one line.")
        assert app.engine is first_engine                      # sampling only: same engine

        await pilot.press("ctrl+o")
        await submit_settings(pilot, app, {"model": "another-model"})
        assert app.engine is not first_engine and app.engine.spec.model == "another-model"
        assert json.loads((tmp_path / "settings.json").read_text())["model"] == "another-model"

        await submit_prompt(pilot, app.chat, "hi")
        await pilot.pause()
        op, args, kwargs = app.engine.requests[-1]
        assert (kwargs["temperature"], kwargs["system"]) == (0.5, "Answer in one line.")


async def test_exact_switch_shows_the_runs_numerics_and_saves_a_choice(tmp_path):
    """`chat --exact` with exact numerics off in the saved settings: the switch shows them on (what
    this run does); left as shown, the saved value stays; switched, the choice is saved and the
    engine restarts with it."""
    app = ChatApp(Settings(model="qwen2.5-coder-7b"), demo_history(tmp_path / "history.sqlite"),
                  engine_factory=ScriptedEngine, engine_spec=replace(SPEC, exact=True),
                  settings_file=tmp_path / "settings.json")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first_engine = app.engine
        assert first_engine.spec.exact
        await pilot.press("ctrl+o")
        assert app.screen.query_one("#exact").value is True
        await submit_settings(pilot, app, {"temperature": "0.5"})
        saved = load_settings(tmp_path / "settings.json")
        assert saved.temperature == 0.5 and saved.exact is False     # --exact is not saved
        assert app.engine is first_engine

        await pilot.press("ctrl+o")
        assert app.screen.query_one("#exact").value is True
        await submit_settings(pilot, app, {"exact": False})
        assert load_settings(tmp_path / "settings.json").exact is False
        assert app.engine is not first_engine and not app.engine.spec.exact

        await pilot.press("ctrl+o")
        assert app.screen.query_one("#exact").value is False
        await submit_settings(pilot, app, {"exact": True})
        assert load_settings(tmp_path / "settings.json").exact is True
        assert app.engine.spec.exact


async def test_no_speculation_and_no_personal_are_for_the_run_only(tmp_path):
    """`chat --no-speculation --no-personal` with both on in the saved settings: the run goes
    without them and the form shows them off; saving an unrelated setting keeps the saved values
    (the flags are never saved); switched, the choice is saved and the run follows it."""
    settings_file = tmp_path / "settings.json"
    save_settings(Settings(model="qwen2.5-coder-7b"), settings_file)
    args = build_parser().parse_args(["chat", "--no-speculation", "--no-personal"])
    app = chat_app(args, demo_history(tmp_path / "history.sqlite"), settings_file=settings_file,
                   engine_factory=ScriptedEngine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first_engine = app.engine
        assert not first_engine.spec.speculation and not first_engine.spec.personal
        await pilot.press("ctrl+o")
        assert app.screen.query_one("#speculation").value is False
        assert app.screen.query_one("#stage-personal").value is False
        assert app.screen.query_one("#stage-draft").value is True
        await submit_settings(pilot, app, {"temperature": "0.5"})
        saved = load_settings(settings_file)
        assert saved.temperature == 0.5 and saved.speculation is True       # the flags are not saved
        assert saved.stages == ("personal", "draft")
        assert app.engine is first_engine

        await pilot.press("ctrl+o")
        assert app.screen.query_one("#speculation").value is False
        assert app.screen.query_one("#stage-personal").value is False
        await submit_settings(pilot, app, {"speculation": True})
        assert load_settings(settings_file).speculation is True
        assert app.engine is not first_engine
        assert app.engine.spec.speculation and not app.engine.spec.personal   # --no-personal holds

        await pilot.press("ctrl+o")
        assert app.screen.query_one("#speculation").value is True
        assert app.screen.query_one("#stage-personal").value is False
        await submit_settings(pilot, app, {"stage-personal": True})
        assert load_settings(settings_file).stages == ("personal", "draft")
        assert app.engine.spec.speculation and app.engine.spec.personal

        await pilot.press("ctrl+o")
        await submit_settings(pilot, app, {"speculation": False, "stage-personal": False})
        saved = load_settings(settings_file)
        assert saved.speculation is False and saved.stages == ("draft",)
        assert not app.engine.spec.speculation and not app.engine.spec.personal


async def test_no_head_is_for_the_run_only_and_the_form_saves_a_choice(tmp_path):
    """`chat --no-head`: the run goes without the installed head and the form shows it off; saving
    an unrelated setting keeps heads on in the file; unticked in the form, off is saved."""
    settings_file = tmp_path / "settings.json"
    save_settings(Settings(model="qwen2.5-coder-7b"), settings_file)
    args = build_parser().parse_args(["chat", "--no-head"])
    app = chat_app(args, demo_history(tmp_path / "history.sqlite"), settings_file=settings_file,
                   engine_factory=ScriptedEngine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.engine.spec.use_head is False
        await pilot.press("ctrl+o")
        assert app.screen.query_one("#use_head").value is False
        await submit_settings(pilot, app, {"temperature": "0.5"})
        assert load_settings(settings_file).use_head is True and app.engine.spec.use_head is False

    app = chat_app(build_parser().parse_args(["chat"]), demo_history(tmp_path / "history2.sqlite"),
                   settings_file=settings_file, engine_factory=ScriptedEngine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.engine.spec.use_head is True
        await pilot.press("ctrl+o")
        assert app.screen.query_one("#use_head").value is True
        await submit_settings(pilot, app, {"use_head": False})
        assert load_settings(settings_file).use_head is False and app.engine.spec.use_head is False


async def test_model_and_draft_flags_are_for_the_run_only(tmp_path):
    """`chat --model M --draft D` over a saved model and draft: the run and the form use M and D;
    saving an unrelated setting keeps the saved pair (the flags are never saved); a model typed in
    the settings, or picked on the first-run screen, is saved and the run follows it."""
    settings_file = tmp_path / "settings.json"
    save_settings(Settings(model="saved-model", draft="saved-draft.gguf"), settings_file)
    args = build_parser().parse_args(["chat", "--model", "run-model", "--draft", "run-draft.gguf"])
    app = chat_app(args, demo_history(tmp_path / "history.sqlite"), settings_file=settings_file,
                   engine_factory=ScriptedEngine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first_engine = app.engine
        assert (first_engine.spec.model, first_engine.spec.draft) == ("run-model", "run-draft.gguf")
        await pilot.press("ctrl+o")
        assert app.screen.query_one("#model").value == "run-model"
        assert app.screen.query_one("#draft").value == "run-draft.gguf"
        await submit_settings(pilot, app, {"temperature": "0.5"})
        saved = load_settings(settings_file)
        assert saved.temperature == 0.5                                      # the flags are not saved
        assert (saved.model, saved.draft) == ("saved-model", "saved-draft.gguf")
        assert app.engine is first_engine

        await pilot.press("ctrl+o")
        assert app.screen.query_one("#model").value == "run-model"
        await submit_settings(pilot, app, {"model": "typed-model"})
        saved = load_settings(settings_file)
        assert (saved.model, saved.draft) == ("typed-model", "saved-draft.gguf")   # draft as shown
        assert app.engine is not first_engine
        assert (app.engine.spec.model, app.engine.spec.draft) == ("typed-model", "run-draft.gguf")

        app.engine.inject(Error(None, "Model not found", "no typed-model", "pick one"))
        await wait_until(pilot, lambda: isinstance(app.screen, FirstRunScreen),
                         what="the first-run screen")
        app.post_message(FirstRunScreen.Chosen("picked-model"))          # Enter on an installed one
        await wait_until(pilot, lambda: app.screen is app.chat, what="the chat")
        saved = load_settings(settings_file)
        assert (saved.model, saved.draft) == ("picked-model", None)
        assert (app.engine.spec.model, app.engine.spec.draft) == ("picked-model", None)


async def test_model_flag_without_draft_runs_the_models_own_draft_only(tmp_path):
    """`chat --model M` alone: the run takes M's own draft, not the saved model's, and the form
    shows the draft empty; left so, the saved draft stays; a draft typed there is saved and used."""
    settings_file = tmp_path / "settings.json"
    save_settings(Settings(model="saved-model", draft="saved-draft.gguf"), settings_file)
    args = build_parser().parse_args(["chat", "--model", "run-model"])
    app = chat_app(args, demo_history(tmp_path / "history.sqlite"), settings_file=settings_file,
                   engine_factory=ScriptedEngine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert (app.engine.spec.model, app.engine.spec.draft) == ("run-model", None)
        await pilot.press("ctrl+o")
        assert app.screen.query_one("#draft").value == ""
        await submit_settings(pilot, app, {"top_k": "20"})
        saved = load_settings(settings_file)
        assert (saved.top_k, saved.model, saved.draft) == (20, "saved-model", "saved-draft.gguf")

        await pilot.press("ctrl+o")
        await submit_settings(pilot, app, {"draft": "typed-draft.gguf"})
        saved = load_settings(settings_file)
        assert (saved.model, saved.draft) == ("saved-model", "typed-draft.gguf")
        assert (app.engine.spec.model, app.engine.spec.draft) == ("run-model", "typed-draft.gguf")


async def test_first_run_lists_installed_models_and_picking_one_opens_the_chat(tiny, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    started = []
    app = ChatApp(Settings(), History.open(tmp_path / "history.sqlite"),
                  engine_factory=lambda spec: started.append(spec) or _Silent(),
                  settings_file=tmp_path / "settings.json")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, FirstRunScreen)
        assert "No model is set up" in str(app.screen.query_one("#problem").render())
        assert not started
        library.import_model("tiny", tiny.target_gguf, tiny.draft_gguf)   # in another terminal
        await pilot.press("r")                                            # rescan
        await pilot.pause()
        models = app.screen.query_one("#models")
        assert [item.name for item in models.children] == ["tiny"]
        models.focus()
        models.index = 0
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is app.chat and [s.model for s in started] == ["tiny"]
        assert load_settings(tmp_path / "settings.json").model == "tiny"


async def test_broken_model_is_an_explained_state(tiny, tmp_path, monkeypatch):
    """The real engine process fails to load a truncated GGUF: the first-run screen explains it."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny.target_gguf.read_bytes()[:4096])
    h = make_app(tiny, tmp_path, model=str(broken))
    async with h.app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(h.app.screen, FirstRunScreen)
                         and h.app.screen.query("#problem"), what="the first-run screen")
        problem = str(h.app.screen.query_one("#problem").render())
        assert "broken.gguf" in problem and "fix:" in problem
        assert h.app.engine is None and h.app.is_running


class _Silent:
    """An engine that never says anything (the first-run test only checks it is started)."""

    def start(self) -> None: ...
    def close(self) -> None: ...

    def poll(self, timeout=0.0):
        return None


async def test_rename_conversation(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        conv = app.chat.conversation
        await pilot.press("f2")
        field = app.screen.query_one("#answer")
        assert field.value == conv.title
        field.value = "  Reversing   strings "
        await pilot.press("enter")
        await pilot.pause()
        assert app.history.conversation(conv.id).title == "Reversing strings"
        sidebar = app.chat.query_one("#conversations")
        assert str(sidebar.children[0].query_one("Label").render()) == "Reversing strings"
        await pilot.press("f2", "escape")                     # Esc cancels
        assert app.history.conversation(conv.id).title == "Reversing strings"


def test_a_head_given_at_launch_goes_with_its_model_only(tmp_path):
    """`chat --head FILE`: the head was trained for the model the chat started with; a model
    picked later in the settings starts without it (instead of being refused)."""
    from dataclasses import replace


    history = History.open(tmp_path / "history.sqlite")
    try:
        app = ChatApp(Settings(model="coder"), history,
                      engine_spec=Options(model="", head="coder-head.npz", exact=True))
        assert app.spec_for(app.settings).head == "coder-head.npz"
        other = app.spec_for(replace(app.settings, model="other"))
        assert other.head is None and other.model == "other" and other.exact
    finally:
        history.close()
