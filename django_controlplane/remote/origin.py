"""Origin checks for WebSockets that let token-authenticated non-browser clients in.

Channels' ``AllowedHostsOriginValidator`` refuses a handshake without an
``Origin`` header. Browsers always send one, and it is what protects
cookie-authenticated sockets from other sites (cross-site WebSocket
hijacking). A worker process (the Python client, ``websocat``, a Go or Java
program) usually sends none, and it authenticates with its API token, which
a foreign page cannot make a browser attach. So:

* with an ``Origin`` header, the usual allowed-hosts check applies, whatever
  the credentials;
* without one, the handshake goes on only if it carries a token
  (``Authorization: Token <key>`` or ``?token=<key>``), and its cookies are
  dropped first, so such a socket can never be authenticated by a session.

Consumers still check the token itself (``django_controlplane.remote.consumers``); this layer only
decides which handshakes may reach them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.security.websocket import AllowedHostsOriginValidator

Scope = dict[str, Any]


def token_from_scope(scope: Scope) -> str | None:
    """The API token of a handshake: the ``Authorization: Token`` header, else ``?token=``.

    The query parameter exists for clients that cannot set headers; it may
    end up in proxy and access logs, so prefer the header (the Python client
    sends the header).
    """
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            if scheme.lower() == "token" and key.strip():
                return key.strip()
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get("token"):
        return query["token"][0]
    return None


def has_origin(scope: Scope) -> bool:
    return any(name.lower() == b"origin" for name, _ in scope.get("headers", []))


class TokenOrOriginValidator:
    """ASGI middleware: the allowed-hosts Origin check, except for token-only clients.

    Use it where ``AllowedHostsOriginValidator`` would go, around the auth
    middleware: ``TokenOrOriginValidator(AuthMiddlewareStack(URLRouter(...)))``.
    """

    def __init__(self, application: Any) -> None:
        self.application = application
        self.checked = AllowedHostsOriginValidator(application)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> Any:
        if scope.get("type") == "websocket" and not has_origin(scope) and token_from_scope(scope):
            headers = [(n, v) for n, v in scope.get("headers", []) if n.lower() != b"cookie"]
            return await self.application({**scope, "headers": headers}, receive, send)
        return await self.checked(scope, receive, send)
