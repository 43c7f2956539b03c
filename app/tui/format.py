"""Text the chat shows about speculation and engine state, as pure functions of plain data
(the engine's events and DecodeStats.to_dict()), so they are tested without a terminal."""
from __future__ import annotations

from pathlib import Path

# How a message ended: (mark, style). "complete" has no mark.
STATE_MARKS = {
    "streaming": ("● streaming", "yellow"),
    "stopped": ("■ stopped", "yellow"),
    "partial": ("… interrupted (partial)", "yellow"),
    "error": ("✖ failed", "red"),
}
# The speed-up against plain decoding is shown once it rests on enough rounds to mean something:
# the reply's own rounds (how many tokens a round yields varies a lot from round to round) and the
# plain rounds the adaptive budget timed (their time varies with the machine's load). With fewer,
# its spread is beyond about 10% and it reads "vs plain …" (docs/decisions/0021).
MIN_ROUNDS = 128
MIN_PLAIN_ROUNDS = 32
_SOURCE_STYLES = {"target": "", "maxgram": "bold green", "personal-ngram": "bold magenta"}
DRAFT_STYLE = "bold cyan"      # any model drafter (its name is the draft file's)


def source_style(source: str) -> str:
    return _SOURCE_STYLES.get(source, DRAFT_STYLE)


def lead_source(sources: list[str]) -> str:
    """The proposer a whole round's text is coloured by when the engine could not split it per
    token (a character split across rounds): the drafter that proposed most of its tokens, else
    "target"."""
    drafted = [s for s in sources if s != "target"]
    if not drafted:
        return "target"
    return max(dict.fromkeys(drafted), key=drafted.count)


def engine_line(model: str | None, draft: str | None, device: str | None, gpu_layers: int,
                state: str) -> str:
    """'target.gguf + draft.gguf · GPU (name), 28 layers offloaded', or the engine's state."""
    if model is None:
        return state
    name = Path(model).name + (f" + {Path(draft).name}" if draft else "")
    where = device or "?"
    if gpu_layers:
        where += f", {gpu_layers} layers offloaded"
    return f"{name} · {where}" + (f" · {state}" if state else "")


def stages_line(stages: list[str] | None) -> str:
    if stages is None:
        return ""
    return "drafters: " + ", ".join(_short(s) for s in stages) if stages else "plain decoding"


def speculation_summary(stats: dict, per_drafter: bool = False, brief: bool = False) -> str:
    """'23.1 tok/s · 2.40 tok/call · 1.6× vs plain · maxgram 71% draft 64%' from a reply's stats."""
    parts = []
    tok_s = stats.get("tokens_per_second")
    if tok_s:
        parts.append(f"{tok_s:.1f} tok/s")
    elif stats.get("wall_seconds") and stats.get("tokens"):
        parts.append(f"{stats['tokens'] / stats['wall_seconds']:.1f} tok/s")
    if stats.get("tokens_per_call"):
        parts.append(f"{stats['tokens_per_call']:.2f} tok/call")
    if brief:
        return " · ".join(parts)
    if against := vs_plain(stats):
        parts.append(against)
    if per_drafter:
        rates = [f"{_short(s['name'])} {100 * s['acceptance']:.0f}%"
                 for s in stats.get("stages", []) if s.get("proposed")]
        if rates:
            parts.append("accepted " + " ".join(rates))
    return " · ".join(parts) if parts else f"{stats.get('tokens', 0)} tokens"


def context_line(stats: dict) -> str:
    """'context 1,234 of 32,768 (dropped 4 oldest messages)' from a reply's stats: what the
    conversation fills of the model's context, the reply included; '' without the figures."""
    size = stats.get("context_size")
    if not size:
        return ""
    used = stats.get("prompt_tokens", 0) + stats.get("tokens", 0)
    line = f"context {used:,} of {size:,}"
    dropped = stats.get("dropped_messages")
    if dropped:
        line += f" (dropped {dropped} oldest message{'s' if dropped > 1 else ''})"
    return line


def vs_plain(stats: dict) -> str:
    """'1.74× vs plain' from a reply's stats; 'vs plain …' while the reply or the plain rate rests
    on too few rounds; '' where plain decoding was not measured (no adaptive budget)."""
    tok_s, plain = stats.get("tokens_per_second"), stats.get("plain_tok_s")
    if not (tok_s and plain):
        return ""
    if stats.get("target_calls", 0) < MIN_ROUNDS or stats.get("plain_rounds", 0) < MIN_PLAIN_ROUNDS:
        return "vs plain …"
    return f"{tok_s / plain:.2f}× vs plain"


def _short(stage: str) -> str:
    return Path(stage).stem if stage.endswith(".gguf") else stage
