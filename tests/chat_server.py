"""A local OpenAI-shaped chat-completions server that replies from a script, for tests of the
judge and of the model-backed synthesis roles (real HTTP, no client mocks)."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (status, content) or (status, content, extra response headers)
Step = tuple[int, str] | tuple[int, str, dict[str, str]]
# A script is a list of steps played in order (the last repeats), or a function of the request's
# prompt (its first message) giving the step.
Script = list[Step] | Callable[[str], Step]


class ChatServer:
    """Serves `script` on a free local port; records every request, its headers and its time."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.times: list[float] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def _step(self, body: dict) -> Step:
        if callable(self.script):
            return self.script(body["messages"][0]["content"])
        return self.script[min(len(self.requests), len(self.script) - 1)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    step = fake._step(body)
                    fake.requests.append({"path": self.path, **body})
                    fake.headers.append(dict(self.headers))
                    fake.times.append(time.monotonic())
                status, content = step[0], step[1]
                extra = step[2] if len(step) > 2 else {}
                reply = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def gaps(self) -> list[float]:
        """Seconds between consecutive requests."""
        return [later - earlier for earlier, later in itertools.pairwise(self.times)]

    def prompts(self) -> list[str]:
        """The prompt (first message) of every request, in order."""
        return [request["messages"][0]["content"] for request in self.requests]


@contextlib.contextmanager
def chat_servers() -> Iterator[Callable[[Script], ChatServer]]:
    """A factory of scripted servers, each serving until the block ends."""
    started: list[ChatServer] = []

    def start(script: Script) -> ChatServer:
        server = ChatServer(script)
        # A short poll interval keeps shutdown (once per test) fast.
        threading.Thread(target=server.server.serve_forever, args=(0.01,), daemon=True).start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.server.shutdown()
            server.server.server_close()
