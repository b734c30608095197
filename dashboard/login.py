"""The dashboard's sign-in page, with a brake on password guessing.

Failed sign-ins are counted per user name and client address in Django's
cache; after ``LOGIN_MAX_FAILURES`` (5) within ``LOGIN_LOCKOUT_SECONDS``
(15 minutes) the page refuses that pair with a 429 and says when to try
again, without checking the password. A success clears the count. The
default cache is per process: with several web processes, configure a
shared cache (Redis, Memcached, the database) to count across them.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse

MAX_FAILURES = 5
LOCKOUT_SECONDS = 15 * 60


def _limits() -> tuple[int, float]:
    knobs = getattr(settings, "CONTROLPLANE", {}) or {}
    return (
        int(knobs.get("LOGIN_MAX_FAILURES", MAX_FAILURES)),
        float(knobs.get("LOGIN_LOCKOUT_SECONDS", LOCKOUT_SECONDS)),
    )


def _key(request: HttpRequest) -> str:
    username = str(request.POST.get("username", "")).strip().lower()
    address = request.META.get("REMOTE_ADDR", "")
    digest = hashlib.sha256(f"{username}\0{address}".encode("utf-8", "replace")).hexdigest()
    return f"controlplane:login-failures:{digest}"


class ThrottledLoginView(auth_views.LoginView):
    template_name = "dashboard/login.html"
    next_page = "dashboard:overview"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        most, window = _limits()
        key = _key(request)
        failures, first = cache.get(key, (0, time.time()))
        if failures >= most:
            wait = max(first + window - time.time(), 1)
            context = self.get_context_data(
                form=self.get_form_class()(request),
                locked_out=f"Too many failed sign-ins for this user name from your address: "
                f"try again in {math.ceil(wait / 60)} minute{'s' if wait > 60 else ''}.",
            )
            return self.render_to_response(context, status=429)
        response = super().post(request, *args, **kwargs)
        if request.user.is_authenticated:
            cache.delete(key)
        else:
            now = time.time()
            if failures == 0 or now - first > window:
                failures, first = 0, now
            cache.set(key, (failures + 1, first), timeout=max(int(first + window - now), 1))
        return response
