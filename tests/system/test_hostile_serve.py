"""Hostile HTTP against `localspec serve` (issue 44), on raw sockets: malformed JSON, wrong
types, negative and absurd max_tokens, a 100 MB body, a client that sends a byte a second (its
headers or its body), one that sends nothing, one that leaves mid-stream or mid-reply, unknown
routes and methods, another Host, bytes that are not HTTP. Each ends in a 4xx JSON error in
OpenAI's shape or a closed connection, within a bound, never a traceback; the server stays
healthy and answers the next request, and a client that left stopped its generation.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest
from serve_server import start_server

READ_TIMEOUT = 2          # the server's --read-timeout
MAX_BODY = 1 << 20        # its --max-body
BOUND_S = READ_TIMEOUT + 8
CHAT = [{"role": "user", "content": "Write a function that returns the largest number in a list."}]
WILD = {"temperature": 2.0, "top_k": 0, "top_p": 1.0, "max_tokens": 1500}   # long sampled replies


@pytest.fixture(scope="module")
def server(tiny):
    served = start_server(tiny, "--ctx", "2048", "--fixed-budget", "--no-personal", "--queue", "2",
                          "--read-timeout", str(READ_TIMEOUT), "--max-body", str(MAX_BODY))
    yield served
    assert served.stop(signal.SIGTERM) == 0
    assert "Traceback" not in served.log_text() and "bug:" not in served.log_text()


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S)


def request(method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> bytes:
    head = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
    if body is not None:
        head.setdefault("Content-Type", "application/json")
        head.setdefault("Content-Length", str(len(body)))
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items()), "", ""]
    return "\r\n".join(lines).encode() + (body or b"")


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes (a reset after a response counts as a close)."""
    data = b""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            break
        if not part:
            break
        data += part
    else:
        raise AssertionError(f"the connection stayed open past {BOUND_S} s: {data[:300]!r}")
    return data


def parse(data: bytes) -> tuple[int, dict, object]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, json.loads(body) if headers.get("content-type") == "application/json" else body


def send(server, raw: bytes) -> tuple[int, dict, object]:
    with connect(server) as sock:
        sock.sendall(raw)
        return parse(read_all(sock))


def post(server, body: object, path: str = "/v1/chat/completions") -> tuple[int, dict, object]:
    return send(server, request("POST", path, json.dumps(body).encode()))


def assert_error(reply: tuple[int, dict, object], status: int, param: str | None = None) -> dict:
    got, _, body = reply
    assert got == status, reply
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def still_serving(server) -> None:
    status, _, body = post(server, {"messages": CHAT, "max_tokens": 4})
    assert status == 200 and body["choices"][0]["message"]["content"] is not None


def test_malformed_json_and_wrong_types_are_400s_naming_the_parameter(server):
    t0 = time.monotonic()
    assert_error(send(server, request("POST", "/v1/chat/completions", b'{"messages": [')), 400)["code"] == "invalid_json"
    assert_error(send(server, request("POST", "/v1/chat/completions", b"\xff\xfe{}")), 400)
    assert_error(send(server, request("POST", "/v1/chat/completions", b"")), 400)
    assert_error(post(server, [1, 2, 3]), 400)
    assert_error(post(server, {"messages": "hello"}), 400, "messages")
    assert_error(post(server, {"messages": []}), 400, "messages")
    assert_error(post(server, {"messages": [{"role": "robot", "content": "x"}]}), 400, "messages[0].role")
    assert_error(post(server, {"messages": [{"role": "user", "content": 5}]}), 400)
    assert_error(post(server, {"messages": CHAT, "temperature": "hot"}), 400, "temperature")
    assert_error(post(server, {"messages": CHAT, "stream": "yes"}), 400, "stream")
    assert_error(post(server, {"messages": CHAT, "stop": [""]}), 400, "stop")
    assert_error(post(server, {"messages": CHAT, "stop": ["a"] * 5}), 400, "stop")
    assert_error(post(server, {"prompt": ["a", "b"]}, "/v1/completions"), 400, "prompt")
    assert_error(post(server, {"prompt": 7}, "/v1/completions"), 400, "prompt")
    image = [{"type": "image_url", "image_url": {"url": "http://example.com/x.png"}}]
    assert_error(post(server, {"messages": [{"role": "user", "content": image}]}), 400, "messages[0].content")
    assert_error(post(server, {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}), 400)
    assert time.monotonic() - t0 < BOUND_S
    still_serving(server)


@pytest.mark.parametrize("value", [-5, 0, 10**12, 10**40, 2**31, 1e3, "64", True, 4096])
def test_negative_or_absurd_max_tokens_are_refused(server, value):
    for field in ("max_tokens", "max_completion_tokens"):
        assert_error(post(server, {"messages": CHAT, field: value}), 400, field)


def test_a_100_mb_body_is_refused_without_being_read(server):
    t0 = time.monotonic()
    with connect(server) as sock:
        sock.sendall(request("POST", "/v1/chat/completions", headers={
            "Content-Type": "application/json", "Content-Length": str(100 << 20)}))
        sock.settimeout(0.5)
        sent = 0
        try:
            while sent < 100 << 20 and time.monotonic() - t0 < BOUND_S:
                sent += sock.send(b" " * (1 << 20))
        except (socket.timeout, BrokenPipeError, ConnectionResetError):
            pass   # the server stopped reading, or closed: as it should
        sock.settimeout(BOUND_S)
        data = read_all(sock)
    assert time.monotonic() - t0 < BOUND_S and sent < 100 << 20
    if data:
        assert_error(parse(data), 413)
    still_serving(server)


def test_a_chunked_body_past_the_cap_is_refused(server):
    with connect(server) as sock:
        sock.sendall(request("POST", "/v1/chat/completions", headers={
            "Content-Type": "application/json", "Transfer-Encoding": "chunked"}))
        chunk = b"a" * 65536
        try:
            for _ in range(2 * MAX_BODY // len(chunk)):
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = read_all(sock)
    if data:
        assert_error(parse(data), 413)
    still_serving(server)


def test_a_client_sending_a_byte_a_second_is_cut_off(server):
    raw = request("POST", "/v1/chat/completions", json.dumps({"messages": CHAT}).encode())
    for what, trickle in (("headers", raw), ("body", raw[raw.index(b"\r\n\r\n") + 4:])):
        t0 = time.monotonic()
        with connect(server) as sock:
            if what == "body":
                sock.sendall(raw[:raw.index(b"\r\n\r\n") + 4])
            closed, data = False, b""
            for byte in trickle[:BOUND_S + 5]:
                try:
                    sock.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                sock.settimeout(1.0)
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    continue
                except ConnectionResetError:
                    closed = True
                    break
                closed = True   # the server answered (408) or closed (b"")
                if data:
                    sock.settimeout(BOUND_S)
                    data += read_all(sock)
                break
        assert closed, what
        assert time.monotonic() - t0 < READ_TIMEOUT + 4, what
        if what == "body":
            assert_error(parse(data), 408)
    with connect(server) as idle:   # a client that sends nothing at all
        t0 = time.monotonic()
        assert read_all(idle) == b"" and time.monotonic() - t0 < READ_TIMEOUT + 4
    still_serving(server)


def test_a_client_that_leaves_mid_stream_or_mid_reply_stops_its_generation(server):
    for stream in (True, False):
        with connect(server) as sock:
            sock.sendall(request("POST", "/v1/chat/completions",
                                 json.dumps({"messages": CHAT, "stream": stream, **WILD}).encode()))
            if stream:
                seen = b""
                while b"data: " not in seen:               # the headers, then the first chunk
                    part = sock.recv(65536)
                    assert part, seen
                    seen += part
            else:   # held: the reply is running when the client leaves, however a sampled one ends
                (engine,) = _engine_of(server)
                os.kill(engine, signal.SIGSTOP)
                time.sleep(0.3)
        if not stream:
            time.sleep(0.3)                                   # the server has seen the client leave
            os.kill(engine, signal.SIGCONT)
        t0 = time.monotonic()
        still_serving(server)   # not behind a 1500-token reply: the one that left was stopped
        assert time.monotonic() - t0 < 15
    log = server.log_text()
    assert log.count("client left") >= 2, log[-2000:]


def test_unknown_routes_methods_hosts_and_garbage(server):
    assert_error(send(server, request("GET", "/v1/nope")), 404)["code"] == "not_found"
    assert_error(send(server, request("GET", "/../../etc/passwd")), 404)
    assert_error(send(server, request("GET", "/%1b]52;c;aGk=%07")), 404)
    assert_error(send(server, request("DELETE", "/v1/models")), 405)
    assert_error(send(server, request("GET", "/v1/chat/completions")), 405)
    assert_error(send(server, request("GET", "/v1/models/other-model")), 404, "model")
    assert_error(send(server, request("GET", "/v1/models", headers={"Host": "evil.example:8080"})), 403)
    assert "\x1b" not in server.log_text()
    for garbage in (b"HELLO\r\n\r\n", b"\x16\x03\x01\x02\x00" + b"\x00" * 100,   # not HTTP; a TLS hello
                    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n"):
        with connect(server) as sock:
            try:
                sock.sendall(garbage)
            except (BrokenPipeError, ConnectionResetError):
                continue
            data = read_all(sock)
        assert not data or 400 <= int(data.split()[1]) < 500, data[:200]
    assert server.healthy()
    still_serving(server)


def _engine_of(server) -> list[int]:
    """The server's engine process (its one child)."""
    out = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]
