"""Running the server: stdio (the default), or streamable HTTP on 127.0.0.1 behind a
bearer token."""

from __future__ import annotations

import hmac
import logging
import secrets
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

log = logging.getLogger(__name__)


class BearerAuth:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = b'{"error": "missing or wrong bearer token: send Authorization: Bearer <token>"}'
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def serve_stdio(server: MCPServer) -> None:
    server.run("stdio")


def serve_http(server: MCPServer, port: int, token: str | None) -> None:
    import uvicorn

    if not token:
        token = secrets.token_urlsafe(24)
        print(f"nitro serve --http: bearer token {token}", file=sys.stderr, flush=True)
    app = BearerAuth(server.streamable_http_app(host="127.0.0.1"), token)
    print(
        f"nitro serve --http: listening on http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
