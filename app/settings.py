"""User settings for chat (and `localspec ask`): one JSON file under the user config dir.

Why it is shaped so:

* A frozen dataclass with defaults: a setting the file lacks takes its default, a key this version
  does not know is ignored, so files from older and newer versions both load.
* Saved atomically (temp file in the same folder, fsync, os.replace, fsync of the folder): a kill
  at any moment leaves the old or the new file, never half of one.
* A corrupt file is an explained state, never a traceback: `load_settings` raises LocalspecError
  (title, cause, fix); `load_settings_or_default` falls back to the defaults and returns that error
  as a notice for the UI to show. The bad file is left in place until the user saves. It is read
  as every file of localspec's own is (models/own_files.py): a regular file, at most
  SETTINGS_MAX_BYTES, so a FIFO or a link to /dev/zero is one more corrupt file.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import platformdirs

from localspec.engine.errors import LocalspecError
from localspec.engine.options import Options
from localspec.engine.options import problems as option_problems
from localspec.models.own_files import SETTINGS_MAX_BYTES, Unreadable, read_json

FILE_NAME = "settings.json"
# a system prompt of ~64k tokens, as big as most contexts; saved as JSON with every character
# escaped (12 bytes for one outside the BMP) it still fits the settings file's cap
SYSTEM_PROMPT_MAX_CHARS = 256 << 10
STAGES = ("personal", "draft")   # optional speculation stages (Max-Gram always runs with speculation)


@dataclass(frozen=True)
class Settings:
    model: str | None = None           # a .gguf path or an installed model's name
    draft: str | None = None           # None: the installed model's registered draft, if any
    temperature: float = 0.0           # 0 = greedy
    top_p: float = 0.95
    top_k: int = 40
    max_tokens: int = 1024
    seed: int | None = None            # sampling seed; None: a new one for every reply
    speculation: bool = True
    stages: tuple[str, ...] = STAGES
    use_head: bool = True              # the draft head installed for the model, when there is one
                                       # (a flag of its own, not a stage: files saved before heads
                                       # were found automatically list their stages without it)
    system_prompt: str = ""
    show_sources: bool = False         # colour each token by the drafter that proposed it
    exact: bool = False                # exact numerics (CPU): speculation emits plain decoding's tokens
    kv_cache_mb: int = Options.kv_cache_mb   # conversation caches kept on disk (MiB); 0: none

    def __post_init__(self) -> None:
        # the same rules as the command line's flags (engine/options.py); seed null: a new
        # seed for every reply
        problems = option_problems({"temperature": self.temperature, "top_p": self.top_p,
                                    "top_k": self.top_k, "max_tokens": self.max_tokens,
                                    "kv_cache_mb": self.kv_cache_mb,
                                    **({"seed": self.seed} if self.seed is not None else {})})
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            problems.append(f"stages {unknown} (known: {', '.join(STAGES)})")
        for name in ("model", "draft"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                problems.append(f"{name} {value!r} (want a path or a name)")
        if not isinstance(self.system_prompt, str):
            problems.append("system_prompt (want text)")
        elif len(self.system_prompt) > SYSTEM_PROMPT_MAX_CHARS:
            problems.append(f"system_prompt of {len(self.system_prompt):,} characters (want at most "
                            f"{SYSTEM_PROMPT_MAX_CHARS:,}: a longer one fits no context worth "
                            "having; attach a long text to a message instead)")
        if problems:
            raise ValueError("; ".join(problems))

    def to_json(self) -> dict:
        d = asdict(self)
        d["stages"] = list(self.stages)
        return d

    @classmethod
    def from_json(cls, raw: dict) -> Settings:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        if "stages" in values:
            values["stages"] = tuple(values["stages"])
        for name in ("speculation", "use_head", "show_sources", "exact"):
            if name in values and not isinstance(values[name], bool):
                raise ValueError(f"{name} {values[name]!r} (want true or false)")
        return cls(**values)


def config_dir() -> Path:
    """$LOCALSPEC_CONFIG_DIR, else the platform's user config dir."""
    override = os.environ.get("LOCALSPEC_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir("localspec"))


def settings_path() -> Path:
    return config_dir() / FILE_NAME


def load_settings(path: Path | None = None) -> Settings:
    """The saved settings; defaults when there is no file; LocalspecError when it is corrupt."""
    path = path or settings_path()
    try:
        raw = read_json(path, SETTINGS_MAX_BYTES)
    except FileNotFoundError:
        return Settings()
    except Unreadable as err:
        raise _corrupt(path, err.why) from None
    if not isinstance(raw, dict):
        raise _corrupt(path, "it does not hold a JSON object")
    try:
        return Settings.from_json(raw)
    except (TypeError, ValueError) as err:
        raise _corrupt(path, f"bad value: {err}") from None


def load_settings_or_default(path: Path | None = None) -> tuple[Settings, LocalspecError | None]:
    """(settings, None), or (defaults, the error to show) when the file is corrupt."""
    try:
        return load_settings(path), None
    except LocalspecError as err:
        return Settings(), err


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write atomically: temp file in the same folder, fsync, os.replace, fsync the folder."""
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps(settings.to_json(), indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def _corrupt(path: Path, cause: str) -> LocalspecError:
    return LocalspecError("Settings file is unreadable", f"'{path}': {cause}",
                          f"Fix or delete '{path}'; saving settings from the chat's settings "
                          "screen (Ctrl+O) rewrites it")
