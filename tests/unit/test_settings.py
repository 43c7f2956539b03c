"""Settings: round trip, defaults, atomic save, corrupt files explained (never a traceback)."""
from __future__ import annotations

import json

import pytest

from localspec.app.settings import (Settings, load_settings, load_settings_or_default,
                                    save_settings, settings_path)
from localspec.engine.errors import LocalspecError


def test_round_trip_and_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_CONFIG_DIR", str(tmp_path / "cfg"))
    assert load_settings() == Settings()                    # no file: defaults
    s = Settings(model="coder", temperature=0.7, top_p=0.9, top_k=20, max_tokens=64,
                 speculation=False, stages=("personal",), system_prompt="Be brief.",
                 show_sources=True)
    path = save_settings(s)
    assert path == settings_path() and path.parent == tmp_path / "cfg"
    assert load_settings() == s
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]   # no temp file left


def test_unknown_keys_ignored_missing_keys_default(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"temperature": 0.5, "from_the_future": 1}))
    assert load_settings(path) == Settings(temperature=0.5)
    # a file saved before heads were found automatically: its stages list no head, heads stay on
    path.write_text(json.dumps({"stages": ["personal", "draft"]}))
    assert load_settings(path).use_head is True
    path.write_text(json.dumps({"use_head": False}))
    assert load_settings(path).use_head is False


@pytest.mark.parametrize("body, cause", [
    ("{not json", "Expecting property name"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"temperature": -1}), "temperature"),
    (json.dumps({"stages": ["warp"]}), "stages"),
    (json.dumps({"speculation": "yes"}), "speculation"),
    (json.dumps({"use_head": "off"}), "use_head"),
    (json.dumps({"max_tokens": "many"}), "max_tokens"),
])
def test_corrupt_file_is_explained_and_falls_back(tmp_path, body, cause):
    path = tmp_path / "s.json"
    path.write_text(body)
    with pytest.raises(LocalspecError, match="Settings file is unreadable") as err:
        load_settings(path)
    assert cause in err.value.cause and str(path) in err.value.fix
    settings, notice = load_settings_or_default(path)
    assert settings == Settings() and notice is not None
    assert path.read_text() == body                         # left for the user to inspect


def test_save_replaces_atomically(tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    save_settings(Settings(temperature=0.1), path)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        save_settings(Settings(temperature=0.9), path)
    assert load_settings(path).temperature == 0.1           # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_the_conversation_cache_cap_is_a_setting_checked_like_a_flag():
    from localspec.app.run_options import settings_options
    from localspec.engine.options import Options

    assert Settings().kv_cache_mb == Options.kv_cache_mb == 4096
    assert settings_options(Settings(kv_cache_mb=0), Options("m.gguf")).kv_cache_mb == 0
    with pytest.raises(ValueError, match="kv_cache_mb -1"):   # load_settings words it for the file
        Settings(kv_cache_mb=-1)
