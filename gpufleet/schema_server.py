"""``gpufleet schemas serve``: ``schemas.registry.SchemaRegistry``'s answers over HTTP, a
Starlette application served by ``gpufleet.asgi_server`` (request parsing, idle and read
timeouts are the server's; a body over 1 MiB is refused with 413)."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpufleet.asgi_server import AsgiServer
from schemas.registry import CONTENT_TYPE, SchemaRegistry

MAX_BODY_BYTES = 1 << 20


def registry_app(registry: SchemaRegistry) -> Starlette:
    async def answer(request: Request) -> Response:
        if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
            return Response(f'{{"error_code": 413, "message": "a body over {MAX_BODY_BYTES} bytes"}}', 413,
                            media_type=CONTENT_TYPE)
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        status, payload = registry.answer(request.method, path, body[:MAX_BODY_BYTES])
        return Response(json.dumps(payload), status, media_type=CONTENT_TYPE)

    return Starlette(routes=[Route("/{path:path}", answer, methods=["GET", "POST", "PUT", "DELETE"])])


class RegistryServer(AsgiServer):
    """The registry on ``host:port`` (0: any free port), in a thread."""

    def __init__(self, registry: SchemaRegistry, host: str = "127.0.0.1", port: int = 8081,
                 idle_s: float = 5.0, read_s: float = 10.0) -> None:
        self.registry = registry
        super().__init__(registry_app(registry), host, port, "schema-registry", idle_s=idle_s, read_s=read_s)
