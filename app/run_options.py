"""The command line's engine options, defined once, and the one rule for run flags over settings.

Why it is shaped so:

* Every command that runs a model (generate, chat, ask, bench, calibrate) adds the same groups
  of flags from here, so a flag is spelt, documented and checked the same way everywhere. The
  flags default to None ("not given"), which lets one conversion (`given`) say what this run
  asked for; validation is engine/options.py's, with the flag named and the range that works.
* `localspec generate` and `calibrate` lay the given flags over `Options`' defaults. `chat` and
  `ask` lay them over the saved settings (app/settings.py) by one rule, `over`: a flag applies to
  this run only. When the user edits the settings form, `edited` decides what is saved: a field
  left as the form showed it keeps its saved value, one changed is saved and the run follows it.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Mapping

from localspec.engine.config import DEFAULT_TREE_NODES, TreeBudget
from localspec.engine.errors import LocalspecError
from localspec.engine.options import Options, check_values

from .settings import STAGES, Settings

EXACT_HELP = ("batch-invariant numerics (CPU only, slower): greedy speculation emits exactly "
              "plain decoding's tokens, bit for bit")


def add_model_options(p: argparse.ArgumentParser, model_required: bool = True,
                      model_help: str = "target model: a .gguf file or an installed model's name "
                                        "(localspec list)") -> None:
    p.add_argument("--model", required=model_required, help=model_help)
    p.add_argument("--draft", help="draft model: a .gguf file (llama.cpp) or a transformers folder (PyTorch)")
    p.add_argument("--head", help="a draft head trained for this target: drafts from the target's own "
                                  "hidden states, in the draft model's place (default: the head "
                                  "`localspec head train` installed for the target, if any)")
    p.add_argument("--ctx", type=int, help="context size in tokens (default: the largest that fits "
                                           "this machine's free memory, up to the model's trained length)")
    p.add_argument("--kv-type", choices=("auto", "f16", "q8_0"),
                   help="the KV cache's cells: q8_0 holds twice the context in the same memory "
                        "(default auto: the type measured no slower where the model runs)")
    p.add_argument("--exact", action="store_true", default=None, help=EXACT_HELP)


def add_threads_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, help="CPU threads (default: the cores this process may use that other processes leave free, looked at each second)")


def add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-speculation", dest="speculation", action="store_false", default=None,
                   help="plain decoding, one token per target call")
    p.add_argument("--no-personal", dest="personal", action="store_false", default=None,
                   help="do not use the personal n-gram drafter built from your chats")
    p.add_argument("--no-head", dest="use_head", action="store_false", default=None,
                   help="do not use the draft head installed for the target")
    p.add_argument("--tree-nodes", type=int,
                   help=f"largest draft tree per round (default {DEFAULT_TREE_NODES})")
    p.add_argument("--fixed-budget", action="store_true", default=None,
                   help="always draft --tree-nodes nodes (default: pick 0..N per round by measured speed)")
    p.add_argument("--gpu-layers", type=int, help="layers to offload to the GPU (default -1: all)")
    add_threads_option(p)


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, help="most tokens to generate")
    p.add_argument("--temperature", type=float, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, help="nucleus filter when sampling (default 0.95, as llama.cpp)")
    p.add_argument("--top-k", type=int, help="top-k filter when sampling (default 40, as llama.cpp; 0 = off)")
    p.add_argument("--seed", type=int, help="sampling seed (default 0)")


# flag dest -> its name among the checked values (engine/options.RULES)
_CHECKED = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
            "max_tokens": "max_tokens", "tree_nodes": "tree_nodes", "ctx": "n_ctx",
            "gpu_layers": "n_gpu_layers", "threads": "n_threads"}


def given(args: argparse.Namespace) -> dict[str, object]:
    """The flags this run was given (dest -> value), checked: LocalspecError names a bad one."""
    flags = {k: v for k, v in vars(args).items() if v is not None}
    check_values({_CHECKED[k]: v for k, v in flags.items() if k in _CHECKED})
    if "head" in flags and flags.get("use_head") is False:
        raise LocalspecError("Both --head and --no-head", f"--head {flags['head']} uses a head, "
                             "--no-head none", "Leave out one of them")
    return flags


def options_from_flags(flags: Mapping[str, object], base: Options) -> Options:
    """`base` with the given flags laid over it."""
    sampling = replace(base.sampling, **{k: flags[k] for k in ("temperature", "top_p", "top_k", "seed")
                                         if k in flags})
    budget = base.budget
    if "tree_nodes" in flags or "fixed_budget" in flags:
        budget = TreeBudget(max_nodes=flags.get("tree_nodes", budget.max_nodes),
                            adaptive=not flags.get("fixed_budget", not budget.adaptive))
    simple = {"model": "model", "draft": "draft", "head": "head", "use_head": "use_head", "ctx": "n_ctx",
              "kv_type": "kv_type", "gpu_layers": "n_gpu_layers", "threads": "n_threads", "exact": "exact", "speculation": "speculation",
              "personal": "personal", "max_tokens": "max_tokens"}
    return replace(base, sampling=sampling, budget=budget,
                   **{field: flags[flag] for flag, field in simple.items() if flag in flags})


# ---- run flags over saved settings --------------------------------------------------------------
# The settings a flag can stand over for one run (chat and ask): the models, exact numerics on,
# speculation, the personal stage and the installed head off, the sampling. "personal" is the
# settings' stage of that name.
OVER_SETTINGS = ("model", "draft", "exact", "speculation", "personal", "use_head",
                 "temperature", "top_p", "top_k", "seed", "max_tokens")


def settings_flags(flags: Mapping[str, object]) -> dict[str, object]:
    """The given flags that stand over settings. A --model brings its own draft (the one given,
    or None: that model's own), never the saved model's; a --head is used even where the saved
    settings keep heads off."""
    out = {k: flags[k] for k in OVER_SETTINGS if k in flags}
    if "model" in out:
        out["draft"] = flags.get("draft")
    if "head" in flags:
        out["use_head"] = True
    return out


def spec_flags(spec: Options) -> dict[str, object]:
    """The flags that stand over settings, from an engine spec built from the flags (chat's
    base spec): a model given (not "") with its draft, a draft alone, exact on, speculation, the
    personal stage or heads off, a head given (heads on)."""
    flags: dict[str, object] = ({"model": spec.model, "draft": spec.draft} if spec.model
                                else {"draft": spec.draft} if spec.draft else {})
    if spec.exact:
        flags["exact"] = True
    if not spec.speculation:
        flags["speculation"] = False
    if not spec.personal:
        flags["personal"] = False
    if spec.head is not None or not spec.use_head:
        flags["use_head"] = spec.use_head
    return flags


def setting(s: Settings, name: str) -> object:
    return "personal" in s.stages if name == "personal" else getattr(s, name)


def with_setting(s: Settings, name: str, value: object) -> Settings:
    if name == "personal":
        return replace(s, stages=tuple(x for x in STAGES
                                       if (value if x == "personal" else x in s.stages)))
    return replace(s, **{name: value})


def over(saved: Settings, flags: Mapping[str, object]) -> Settings:
    """The settings this run uses: the saved ones with the run's flags over them (never saved)."""
    for name, value in flags.items():
        saved = with_setting(saved, name, value)
    return saved


def edited(saved: Settings, flags: Mapping[str, object], form: Settings) -> tuple[Settings, dict[str, object]]:
    """The user saved the settings form, which showed over(saved, flags): what to save, and the
    flags that still stand. A field left as shown keeps its saved value (a flag is never saved);
    one changed is the user's choice: saved, and its flag no longer stands over it."""
    shown = over(saved, flags)
    keep = {}
    for name, value in flags.items():
        if setting(form, name) == setting(shown, name):
            form = with_setting(form, name, setting(saved, name))
            keep[name] = value
    return form, keep


def settings_options(run: Settings, base: Options) -> Options:
    """The engine options for settings (already with the flags over them) on top of `base`,
    which holds what settings do not (context, GPU layers, tree size, a head file)."""
    return replace(base, model=run.model or "", draft=run.draft,
                   use_draft="draft" in run.stages, speculation=run.speculation,
                   personal="personal" in run.stages, use_head=run.use_head, exact=run.exact,
                   kv_cache_mb=run.kv_cache_mb)


def resolved(options: Options) -> Options:
    """`options` ready to build: an installed model's name turned into its files (with its own
    draft, unless a draft was given or drafts are off), the paths expanded."""
    from .paths import head_path, resolve_models

    model, draft = resolve_models(str(options.model), None if options.draft is None else str(options.draft))
    return replace(options, model=model, draft=draft if options.use_draft else None,
                   head=head_path(None if options.head is None else str(options.head)))
