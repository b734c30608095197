"""Static files from the web process itself, through WhiteNoise.

WhiteNoise's own middleware is synchronous only. Django runs a sync-only
middleware on the async path (the long-polling claim) by blocking a thread
for the rest of the request, so one parked long-poll would hold a thread for
its whole wait. This wrapper is both sync and async capable: it asks
WhiteNoise for the file and otherwise steps aside.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.deprecation import MiddlewareMixin
from whitenoise.middleware import WhiteNoiseMiddleware


class StaticFilesMiddleware(MiddlewareMixin):
    def __init__(self, get_response: Any) -> None:
        super().__init__(get_response)
        self.whitenoise = WhiteNoiseMiddleware(get_response)

    def process_request(self, request: HttpRequest) -> Any:
        whitenoise = self.whitenoise
        path = request.path_info
        found = whitenoise.find_file(path) if whitenoise.autorefresh else whitenoise.files.get(path)
        return whitenoise.serve(found, request) if found is not None else None
