"""The first-run screen (issue 20): "Enter picks one" works as soon as the list appears."""
from __future__ import annotations

import pytest

from localspec.app.history import History
from localspec.app.settings import Settings, load_settings
from localspec.app.tui.app import ChatApp
from localspec.app.tui.first_run import FirstRunScreen
from localspec.models import library

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _Silent:
    """An engine that never says anything (only whether it was started matters here)."""

    def start(self) -> None: ...
    def close(self) -> None: ...

    def poll(self, timeout=0.0):
        return None


async def test_enter_picks_the_first_model_without_moving_the_cursor(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    library.import_model("tiny", tiny.target_gguf, tiny.draft_gguf)
    started = []
    history = History.open(tmp_path / "history.sqlite")
    app = ChatApp(Settings(), history, engine_factory=lambda spec: started.append(spec) or _Silent(),
                  settings_file=tmp_path / "settings.json")
    try:
        async with app.run_test(size=(110, 34)) as pilot:
            await pilot.pause()
            assert isinstance(app.screen, FirstRunScreen)
            models = app.screen.query_one("#models")
            assert models.has_focus and models.highlighted_child.name == "tiny"
            await pilot.press("enter")                       # no arrow key first
            await pilot.pause()
            assert app.screen is app.chat and [s.model for s in started] == ["tiny"]
            assert load_settings(tmp_path / "settings.json").model == "tiny"
    finally:
        history.close()


async def test_with_no_model_installed_enter_picks_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    history = History.open(tmp_path / "history.sqlite")
    app = ChatApp(Settings(), history, engine_factory=lambda spec: pytest.fail("no engine"),
                  settings_file=tmp_path / "settings.json")
    try:
        async with app.run_test(size=(110, 34)) as pilot:
            await pilot.pause()
            models = app.screen.query_one("#models")
            assert models.index is None and "localspec list is empty" in str(
                models.children[0].query_one("Label").render())
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(app.screen, FirstRunScreen)
    finally:
        history.close()
