"""``REMOTE_WORKER_GRANTS``: which operations and queues each remote account may serve.

Unset (``None``, the default) there is no allow-list: any account holding
``controlplane.run_remote_jobs`` may serve any remote operation it owns (or
nobody owns) on any queue, as before. Set, it is the allow-list::

    CONTROLPLANE = {
        "REMOTE_WORKER_GRANTS": {
            "users": {"robot-billing": {"operations": ["billing.*"], "queues": ["billing"]}},
            "groups": {"image-robots": {"operations": ["images.*", "thumbnail"],
                                        "queues": ["images", "images-*"]}},
        },
    }

Names are ``fnmatch`` globs, matched case-sensitively (``*``, ``?``, ``[abc]``;
``["*"]`` is everything). An account's grant is its own entry under ``users``
(by user name) together with the entries of each Django group it belongs to
under ``groups``: the operation patterns of all of them, and the queue patterns
of all of them (grants add up; they are not pairs). An account listed nowhere
may serve nothing. Superusers are not exempt: the list says which tokens, so
which machines, may run which code, and a superuser's token on a worker
machine is the one it matters most for (an administrator lists their own
account, or a group, like any other).

Registration is refused (403, ``NotGranted``) when the worker would declare or
serve an operation, or a queue, outside its account's grant. A claim asks the
database only for the operations and queues the grant allows *now* (read on
each attempt), so narrowing it takes effect at a worker's next claim; jobs
already claimed keep their leases and finish.

In the environment, ``CONTROLPLANE_REMOTE_WORKER_GRANTS`` is the same object as
JSON. A malformed value is ``ImproperlyConfigured`` naming what is wrong, on
any use (a registration or claim then answers 500 with that message, logged);
``check_grants`` is the same test as a system check (``controlplane.E010``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from jobs.conf import knob
from jobs.operations import registry

KNOB = "REMOTE_WORKER_GRANTS"
SECTIONS = ("users", "groups")
FIELDS = ("operations", "queues")
EXAMPLE = (
    '{"users": {"robot": {"operations": ["billing.*"], "queues": ["billing"]}}, '
    '"groups": {"image-robots": {"operations": ["images.*"], "queues": ["*"]}}}'
)
# The account's group names, remembered on the (token-cached) user object: the token
# cache forgets a user whose groups change, so this is as fresh as its permissions.
_GROUPS_ATTRIBUTE = "_controlplane_group_names"


@dataclass(frozen=True)
class Grant:
    """What one account may serve: operation and queue name patterns."""

    operations: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.operations and self.queues)

    def allows_operation(self, name: str) -> bool:
        return any(fnmatchcase(name, pattern) for pattern in self.operations)

    def allows_queue(self, name: str) -> bool:
        return any(fnmatchcase(name, pattern) for pattern in self.queues)

    def operations_of(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if self.allows_operation(name)]

    def queues_of(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if self.allows_queue(name)]

    def __or__(self, other: Grant) -> Grant:
        return Grant(
            tuple(dict.fromkeys((*self.operations, *other.operations))),
            tuple(dict.fromkeys((*self.queues, *other.queues))),
        )


Grants = dict[str, dict[str, Grant]]  # section ("users", "groups") -> name -> grant


def _bad(problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"CONTROLPLANE[{KNOB!r}] {problem} Expected None (no allow-list) or an object "
        f"like {EXAMPLE}."
    )


def _patterns(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(p, str) and p.strip() for p in value
    ):
        raise _bad(
            f"{where} must be a list of name patterns (non-empty strings, fnmatch globs; "
            '["*"] for any, [] for none), not {value!r}.'
        )
    return tuple(value)


def parse_grants(raw: Any) -> Grants | None:
    """The knob's value checked and normalised; ``None`` when there is no allow-list."""
    if raw is None:
        return None
    if isinstance(raw, str):  # CONTROLPLANE_REMOTE_WORKER_GRANTS, as JSON
        try:
            raw = json.loads(raw)
        except ValueError:
            raise _bad("is not valid JSON.") from None
        if raw is None:
            return None
    if not isinstance(raw, dict):
        raise _bad(f"must be an object with 'users' and/or 'groups', not {type(raw).__name__}.")
    unknown = sorted(map(str, set(raw) - set(SECTIONS)))
    if unknown:
        raise _bad(
            f"has {', '.join(map(repr, unknown))}; its keys are 'users' (by user name) and "
            "'groups' (by Django group name)."
        )
    grants: Grants = {}
    for section in SECTIONS:
        entries = raw.get(section)
        entries = {} if entries is None else entries
        if not isinstance(entries, dict):
            raise _bad(f"[{section!r}] must map names to grants, not {entries!r}.")
        grants[section] = {}
        for name, entry in entries.items():
            where = f"[{section!r}][{name!r}]"
            if not isinstance(name, str) or not name:
                raise _bad(f"[{section!r}] has {name!r}, which is no {section[:-1]} name.")
            if not isinstance(entry, dict):
                raise _bad(f"{where} must be an object {{'operations': [...], 'queues': [...]}}.")
            missing = [field for field in FIELDS if field not in entry]
            extra = sorted(map(str, set(entry) - set(FIELDS)))
            if missing or extra:
                raise _bad(
                    f"{where} must have exactly 'operations' and 'queues'"
                    + (f" (missing {', '.join(map(repr, missing))})" if missing else "")
                    + (f" (unknown {', '.join(map(repr, extra))})" if extra else "")
                    + "."
                )
            grants[section][name] = Grant(
                operations=_patterns(entry["operations"], f"{where}['operations']"),
                queues=_patterns(entry["queues"], f"{where}['queues']"),
            )
    return grants


def configured_grants() -> Grants | None:
    """``REMOTE_WORKER_GRANTS``, read now (settings or environment), checked."""
    return parse_grants(knob(KNOB))


def _group_names(user: Any) -> list[str]:
    names = getattr(user, _GROUPS_ATTRIBUTE, None)
    if names is None:
        groups = getattr(user, "groups", None)
        names = list(groups.values_list("name", flat=True)) if groups is not None else []
        try:
            setattr(user, _GROUPS_ATTRIBUTE, names)
        except AttributeError:  # an AnonymousUser, say
            pass
    return names


def grant_for(user: Any, grants: Grants | None = None) -> Grant | None:
    """The account's grant now: ``None`` when there is no allow-list (anything goes),
    an empty ``Grant`` when the account is listed nowhere."""
    if grants is None:
        grants = configured_grants()
        if grants is None:
            return None
    grant = Grant()
    username = user.get_username() if hasattr(user, "get_username") else ""
    if username in grants["users"]:
        grant |= grants["users"][username]
    if grants["groups"]:
        for group in _group_names(user):
            if group in grants["groups"]:
                grant |= grants["groups"][group]
    return grant


def check_grants(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A malformed ``REMOTE_WORKER_GRANTS`` as a system check error, before any request
    (for ``checks.register(check_grants, "controlplane")``)."""
    try:
        configured_grants()
    except ImproperlyConfigured as error:
        return [
            checks.Error(
                str(error),
                hint="See docs/remote-workers.md, 'Which accounts serve what'.",
                id="controlplane.E010",
            )
        ]
    return []


def may_serve_local() -> bool:
    """``REMOTE_MAY_SERVE_LOCAL``: whether remote workers may serve local and built-in
    operations (``ping``, the host's ``@operation`` functions)."""
    return bool(knob("REMOTE_MAY_SERVE_LOCAL"))


def remotely_servable(names: Iterable[str]) -> list[str]:
    """``names`` less the local operations, unless remote workers may serve those."""
    if may_serve_local():
        return list(names)
    return [name for name in names if name not in registry]
