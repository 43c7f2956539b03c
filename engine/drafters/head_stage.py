"""The draft head as a stage kind (registry.py): what it needs from the target, how it loads, and
whether it sits out on this machine.

A head drafts from the target's hidden states, so the target opens with them, with the layers the
head's file says it reads beside the last (its taps), and hands back those of a prefill's last
`HEAD_CONTEXT` tokens; torch is imported before llama.cpp loads. The head installed for the target
(found by the model file's fingerprint, `with_head`) drafts only where it would be a free stage,
its one-row step at most `tuning.FREE_STEP_SHARE` of the target's: measured at load, and remembered beside the
calibration, so that later starts on this machine skip loading it (on a GPU: its compile, its
tables, a calibration with hidden states) until `localspec calibrate --refresh` measures again. A
head the user named is used whatever its step costs.

torch (drafters/head.py) and llama.cpp (the calibration's cache) are imported only inside the
hooks that need them: the registry that lists this kind loads neither.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from .. import tuning
from ..config import HEAD_CONTEXT
from ..errors import LocalspecError
from ..options import Options
from .stage import Needs, Parts, Settled, StageKind


def check_head_path(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise LocalspecError("Draft head not found", str(path),
                             "Pass the .npz file `localspec head train` wrote, or leave out --head")
    return path


def with_head(options: Options) -> Options:
    """`options` with the head this run uses named in `head`: when none is given and heads are on
    (`use_head`), the head installed for the target (models/heads.py), if there is one; otherwise
    unchanged. `options.model` must be a path. Reads the target's header (a fraction of a second)."""
    if options.head is not None or not options.use_head or not options.speculation:
        return options
    from localspec.models.heads import head_for

    found = head_for(options.model)
    return options if found is None else replace(options, head=found, head_found=True)


def head_taps(path: str | Path, target: str | Path | None = None) -> tuple[int, ...]:
    """The target layers a head file reads beside the last (its shape's "taps"), which the target
    must be opened with; () for a head without, or a meta that does not say (the head's own load
    then says what is wrong with it). With `target`: refused, with the fix, where the target has
    no such layers (a file made for another model)."""
    from localspec.models.gguf_file import read_gguf
    from localspec.models.head_file import bad_head, read_meta

    try:
        taps = read_meta(check_head_path(path)).get("shape", {}).get("taps", [])
    except (LocalspecError, AttributeError):
        return ()
    if not (isinstance(taps, list) and all(isinstance(t, int) for t in taps)):
        return ()
    if target is not None and taps:
        info = read_gguf(target)
        n_layer = info.n_layer
        if n_layer is None or not all(0 <= t < n_layer for t in taps):
            raise bad_head(Path(path), f"it reads layers {taps}; '{info.path.name}' has "
                                       f"{n_layer or 'no stated number of'} layers")
    return tuple(taps)


def load_head(path: str | Path, model):
    """A DraftHead for `model` (a LlamaModel opened with hidden=True and the head's taps), on the
    GPU where there is one."""
    from localspec.models.head_file import bad_head

    from .head import DraftHead   # torch is heavy: import only when used

    head = DraftHead(check_head_path(path), model.path, n_embd=model.n_embd, vocab_size=model.vocab_size)
    if head.shape.taps != model.taps:
        raise bad_head(head.path, f"it reads the target's layers {list(head.shape.taps)}; the target "
                                  f"was opened reading {list(model.taps)}")
    return head


def _unusable_installed_head(err: LocalspecError, path: Path) -> LocalspecError:
    """A head found for the target that does not load: the user did not name it, so the fix says
    how to run without it too."""
    return LocalspecError(err.title, f"{err.cause} (the head installed for this model)",
                          f"{err.fix}; or run without it: --no-head, or delete '{path}'")


def _share_file(model, head: Path) -> Path:
    """Where the installed head's measured step share is kept: beside the calibration of the
    target with hidden states, named for the head file (`head_tag`)."""
    from ..calibrate import cache_path, default_cache_dir
    from .head import head_tag   # torch: imported only with a head

    path = cache_path([model], default_cache_dir())
    return path.with_name(f"{path.stem}-head-{head_tag(head)}.share.json")


def _remember_share(model, head: Path, share: float) -> None:
    from ..calibrate import write_json
    write_json(_share_file(model, head), {"measured": time.time(), "share": share})


def _sat_out(model, head: Path) -> str | None:
    """Why the installed head sits out, where a load on this machine within the calibration's
    MAX_AGE measured its step over tuning.FREE_STEP_SHARE of the target's; else None (load it and
    measure)."""
    from ..calibrate import MAX_AGE, read_json

    data = read_json(_share_file(model, head))
    share, when = data.get("share"), data.get("measured")
    if not isinstance(share, (int, float)) or not isinstance(when, (int, float)):
        return None
    return _head_too_dear(head, share, when) if time.time() - when < MAX_AGE else None


def _head_too_dear(path: Path, share: float, measured: float | None = None) -> str | None:
    """Why the installed head at `path` sits out on this machine, or None: its one-row step costs
    `share` of the target's, more than tuning.FREE_STEP_SHARE (measured: when a past load measured
    it, a time.time(); None: this load)."""
    if share <= tuning.FREE_STEP_SHARE:
        return None
    when = ("" if measured is None else f"; measured {time.strftime('%Y-%m-%d', time.localtime(measured))}, "
            "`localspec calibrate --refresh` measures again")
    return (f"its step costs {share:.0%} of the model's here (at most {tuning.FREE_STEP_SHARE:.0%} "
            f"pays{when}); --head {path} uses it anyway")


class HeadStage(StageKind):
    """The `head` stage (the module docstring)."""

    def check(self, options: Options) -> None:
        check_head_path(options.head)

    def needs(self, options: Options) -> Needs:
        return Needs(hidden=True, taps=head_taps(options.head, options.model), tail=HEAD_CONTEXT,
                     runtime="torch")   # torch alone: transformers' import would add seconds to each start

    def load(self, options: Options, model, parts: Parts, *, remembered: bool, progress) -> Settled:
        if remembered and options.head_found:
            why = _sat_out(model, Path(options.head))
            if why:   # measured before on this machine: not loaded, not compiled, not timed
                return Settled(parts, sat_out=why)
        try:
            head = load_head(options.head, model)
            head.prepare(progress)    # a GPU's graphs, compiled, before the costs measure them
        except LocalspecError as err:
            from localspec.models.heads import is_installed

            if is_installed(options.head):
                raise _unusable_installed_head(err, Path(options.head)) from None
            raise
        return Settled(replace(parts, head=head, head_limits=options.head_limits))

    def settle(self, options: Options, model, parts: Parts, costs) -> Settled:
        if costs is None:
            return Settled(parts)
        from .head import head_costs

        curve = head_costs(costs, parts.head)       # the head's step, measured now
        if options.head_found:
            share = curve.draft_cost(1) / curve.target_cost(1)
            _remember_share(model, parts.head.path, share)
            why = _head_too_dear(parts.head.path, share)
            if why:
                return Settled(replace(parts, head=None), sat_out=why)
        limits = parts.head_limits
        if limits.floor is None:   # its trees grow only what pays here
            limits = replace(limits, floor=curve.growth_floor(limits.width))
        return Settled(replace(parts, head_limits=limits), curve=curve)

    def make(self, parts: Parts):
        from .head import HeadDrafter         # torch is heavy: imported only when used
        return HeadDrafter(parts.head, parts.head_limits)
