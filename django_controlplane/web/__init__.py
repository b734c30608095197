"""Serving the control plane over HTTP: bounded web processes, and the command that starts them.

- ``threads``: the fixed pool of threads that runs every piece of synchronous
  Django code a request needs, so threads and database connections are bounded.
- ``dispatch``: the ASGI application for HTTP: reads the body (chunked too),
  sends async views to Django's ASGI handler and every other view onto those
  threads, and answers 503 when they are all busy.
- ``responder``: Django's WSGI handler run whole on a web thread, the
  response sent back by the event loop.
- ``overload``: the 503 (with ``Retry-After``) for a full database pool or server.
- ``static``: WhiteNoise as a middleware that does not block the async path.
- ``lifespan``: start-up and shutdown of a server process (closes the pool).
- ``processes``: the server processes of ``manage.py serve``, one ``SO_REUSEPORT``
  socket each on the same port, under a supervisor that restarts them.
"""
