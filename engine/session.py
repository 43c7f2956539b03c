"""A loaded target with its stages, reusable across generations: the library's entry point.

    session = Session(Options("target.gguf", draft="draft.gguf"))
    reply = session.run(session.raw_prompt("def add(a, b):"))   # or stream session.generate's events

`Options`' defaults are what `localspec generate` runs (engine/options.py); engine/build.py loads
the models and builds the stages, costs and engine. The session turns user input (chat messages,
raw text) into generation requests, runs each step of a generation under the numerics switches
its calibration measured with (native.switched: set around the decodes, never left set in the
process), and saves what the adaptive budget learnt when it closes.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .build import build
from .calibrate import Progress, default_cache_dir, write_json
from .chat import chat_tokens
from .config import GenerationRequest, SamplingParams
from .conversation import Fitted, fit, reply_room
from .drafters import registry
from .drafters.head_stage import with_head
from .generation import Event, Generation, finish
from .model_files import ModelFiles
from .model_lock import InUse
from .native import switched
from .options import Options


def draft_runs_in_torch(path: Path | None, torch_draft: bool = False) -> bool:
    """Whether the draft at `path` runs in PyTorch (a transformers folder always does, a .gguf
    when asked); if so torch is imported now, before any llama.cpp model loads
    (registry.first_imports)."""
    if path is None or not (torch_draft or Path(path).expanduser().is_dir()):
        return False
    registry.first_imports(registry.Needs(runtime="transformers"))
    return True


class Session:
    """A loaded target with its stages; reusable across generations."""

    def __init__(self, cfg: Options, progress: Progress | None = None) -> None:
        """progress: told each step of a first calibration on this machine (calibrate.Step)."""
        cfg = with_head(cfg)                   # the head installed for the target, unless told
        if "head" in cfg.stages:
            cfg = replace(cfg, draft=None)     # the head takes the draft model's place
        self.cfg = cfg
        built = self._built = build(cfg, progress)
        self.cfg = cfg = replace(cfg, n_ctx=built.model.n_ctx)   # a fitted context (0) as opened
        self.model, self.stages, self.costs = built.model, built.stages, built.costs
        self.engine, self.store, self.head = built.engine, built.loaded.parts.store, built.loaded.parts.head
        self._learnt_path = built.learnt_path
        # the GGUF files llama.cpp maps (a draft folder is read into memory by torch)
        draft = Path(cfg.draft).expanduser() if cfg.draft is not None and "draft" in cfg.stages else None
        self.files = ModelFiles([self.model.path] + ([draft] if draft is not None else []))
        self._in_use = InUse(self.model.path, default_cache_dir())   # held by each generation (model_lock.py)
        # why the head installed for the target sits out on this machine (build.load), or None
        self.head_left_out = built.loaded.sat_out.get("head")

    def chat_prompt(self, messages: Sequence[dict],
                    should_stop: Callable[[], bool] | None = None) -> list[int]:
        """The chat template's prompt for `messages` (should_stop: see render_chat)."""
        return chat_tokens(self.model, messages, should_stop)

    def fit_chat(self, messages: Sequence[dict], max_tokens: int | None = None,
                 left_out: Sequence[dict] = (),
                 should_stop: Callable[[], bool] | None = None) -> Fitted:
        """The chat prompt for `messages` with room for a reply of max_tokens, leaving out the
        oldest messages where the conversation outgrew the context (engine/conversation.py;
        left_out: the last turn's Fitted.left_out)."""
        n_ctx = self.model.n_ctx
        room = n_ctx - reply_room(n_ctx, self.cfg.max_tokens if max_tokens is None else max_tokens)
        return fit(messages, lambda m: self.chat_prompt(m, should_stop), room, left_out)

    def raw_prompt(self, text: str) -> list[int]:
        return self.model.tokenize(text, special=False)

    def generate(self, tokens: Sequence[int], *, max_tokens: int | None = None,
                 sampling: SamplingParams | None = None, stop: Sequence[str] = (),
                 should_stop: Callable[[], bool] | None = None, reuse: bool = False) -> Iterator[Event]:
        """Stream Rounds, then one Finished with the Generation (see Engine.generate for
        should_stop). max_tokens and sampling default to the options'. reuse: start from what the
        caches hold of the last generation's tokens (a conversation's next turn; GenerationRequest)."""
        request = GenerationRequest(tuple(tokens),
                                    self.cfg.max_tokens if max_tokens is None else max_tokens,
                                    self.cfg.sampling if sampling is None else sampling, tuple(stop),
                                    reuse)
        self.files.check()    # a model file changed in place since the load: ends here, explained
        return self._in_use_while(switched(self._built.loaded.numerics, self.engine.generate(request, should_stop)))

    def _in_use_while(self, events: Iterator[Event]) -> Iterator[Event]:
        """`events`, the model's use lock held shared from the first to the last (or until the
        caller lets the generation go): a measurement elsewhere waits for it, or keeps nothing."""
        with self._in_use.generating():
            yield from events

    def run(self, tokens: Sequence[int], *, max_tokens: int | None = None,
            sampling: SamplingParams | None = None, stop: Sequence[str] = (),
            reuse: bool = False) -> Generation:
        """Generate to the end without streaming."""
        return finish(self.generate(tokens, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                    reuse=reuse))

    def learn(self, conversation_id: str, tokens: Sequence[int]) -> None:
        """Feed a finished exchange (the whole conversation's tokens) to the personal drafter."""
        if self.store is not None:
            from localspec.models.ngram_store import learn
            learn(self.store, conversation_id, tokens)

    def close(self) -> None:
        self._in_use.close()
        if self._learnt_path is not None:
            write_json(self._learnt_path, self.engine.learnt())   # the next run starts from here
        self._built.close()
