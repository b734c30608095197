"""Token authentication that remembers a token for a few seconds.

Pollers (``GET /jobs/<id>/events``, remote workers' heartbeats and claims)
send the same token many times a second. DRF's ``TokenAuthentication`` reads
the token and its user on every request, and ``has_perm`` then reads the
user's permissions: two or three queries before the view runs its own one.
Here a process keeps what it read for ``TOKEN_CACHE_SECONDS`` (the user
object with its permission cache), so a poll costs the view's query alone.

The price: a deleted token, a deactivated user or a removed permission takes
effect in every web process within ``TOKEN_CACHE_SECONDS`` (10 by default;
0 turns the cache off). Deleting a token, saving a user or changing anyone's
permissions or groups in this process forgets here at once.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models.signals import m2m_changed, post_delete, post_save
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from jobs.conf import knob

MAX_ENTRIES = 4096


class _TokenCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, Any, Any]] = OrderedDict()

    def get(self, key: str) -> tuple[Any, Any] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires, user, token = entry
            if expires < time.monotonic():
                del self._entries[key]
                return None
            return user, token

    def put(self, key: str, user: Any, token: Any, ttl: float) -> None:
        with self._lock:
            self._entries[key] = (time.monotonic() + ttl, user, token)
            self._entries.move_to_end(key)
            while len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)

    def forget_user(self, user_id: Any) -> None:
        with self._lock:
            for key in [k for k, (_, user, _) in self._entries.items() if user.pk == user_id]:
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


token_cache = _TokenCache()


class CachedTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>``, read from the database at most once per TTL per process."""

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        ttl = float(knob("TOKEN_CACHE_SECONDS"))
        if ttl > 0:
            hit = token_cache.get(key)
            if hit is not None:
                return hit
        user, token = super().authenticate_credentials(key)
        if ttl > 0:
            token_cache.put(key, user, token, ttl)
        return user, token


def _forget_token(sender: Any, instance: Token, **kwargs: Any) -> None:
    token_cache.forget_user(instance.user_id)


def _forget_user(sender: Any, instance: Any, **kwargs: Any) -> None:
    token_cache.forget_user(instance.pk)


def _forget_all(sender: Any, **kwargs: Any) -> None:
    token_cache.clear()


User = get_user_model()
post_delete.connect(
    _forget_token, sender=Token, dispatch_uid="django_controlplane.api.token_cache.token"
)
post_save.connect(
    _forget_user, sender=User, dispatch_uid="django_controlplane.api.token_cache.user"
)
# Permissions granted or taken through groups or directly: forget everyone (rare).
for through in (User.groups.through, User.user_permissions.through, Group.permissions.through):
    m2m_changed.connect(
        _forget_all, sender=through, dispatch_uid=f"django_controlplane.api.token_cache.{through}"
    )
