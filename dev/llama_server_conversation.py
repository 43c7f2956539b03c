"""bench's conversation workload through llama.cpp's own server, for the side-by-side figure.

The same conversations (app/conversations.py), turn by turn, each reply fed back, through
`llama-server`'s /v1/chat/completions with `cache_prompt` (its cache of the slot's last prompt,
what it keeps between a chat's turns), streamed so that the first token's time is measured as
localspec's bench measures it: from the request to the first piece of text. The server's own
`timings` give its prompt and decode figures. One slot, greedy, the same max tokens.

    python dev/llama_server_conversation.py --server /tmp/cb/bin/llama-server \\
        --model /tmp/mod/target.gguf --max-tokens 200 --out $OUT/llama-server-conversation.json \\
        [--ngl 99] [--extra "--spec-type ngram-simple"] [--long]

Writes a JSON of every turn and prints a table in bench's layout.
"""
from __future__ import annotations

import argparse
import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("llama-server did not become ready")


def turn(base: str, messages: list[dict], max_tokens: int) -> dict:
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                       "stream": True, "cache_prompt": True, "timings_per_token": False}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    started = time.perf_counter()
    first, text, timings = None, [], {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            timings = event.get("timings", timings)
            for choice in event.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - started
                    text.append(piece)
    seconds = time.perf_counter() - started
    return {"ttft_s": round(first if first is not None else seconds, 3), "turn_s": round(seconds, 3),
            "text": "".join(text), "prompt_n": timings.get("prompt_n"),
            "prompt_ms": timings.get("prompt_ms"), "predicted_n": timings.get("predicted_n"),
            "tok_s": timings.get("predicted_per_second")}


def main() -> int:
    from localspec.app.conversations import conversations, long_conversation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="the llama-server binary")
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--extra", default="", help="more llama-server flags, e.g. its speculation")
    ap.add_argument("--long", action="store_true", help="the long conversation (~16k tokens)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [args.server, "-m", args.model, "--port", str(port), "--host", "127.0.0.1", "-c", str(args.ctx),
           "-np", "1", "-ngl", str(args.ngl), "--no-webui", *shlex.split(args.extra)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rows = []
    try:
        wait_ready(base, proc)
        talks = long_conversation(lambda text: len(text) // 3) if args.long else conversations(None)
        for name, turns in talks:
            history: list[dict] = []
            for i, text in enumerate(turns):
                history.append({"role": "user", "content": text})
                got = turn(base, history, args.max_tokens)
                history.append({"role": "assistant", "content": got["text"]})
                rows.append({"conversation": name, "turn": i + 1, **got})
                print(f"{name:<14}{i + 1:>5}{got['prompt_n'] or 0:>8}{got['ttft_s']:>10.3f}"
                      f"{got['tok_s'] or 0:>10.1f}{got['turn_s']:>10.2f}", flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    Path(args.out).write_text(json.dumps({"server": cmd, "turns": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
