"""Flow keys: what a job names to be limited and dispatched fairly beside others.

A key is a short text such as ``account:42``. Its *family* is the text
before the first ``:`` (``account``); a key without ``:`` is its own family.
A job carries up to ``MAX_KEYS`` keys. Each key may be limited
(``jobs.key_limits``): at most N of its jobs running at once across every
worker, at most r started per second. The first key is the job's *fair
key*: within a queue, keyed jobs are started round-robin across fair keys
(``jobs.fair_turns``), and by priority within one key.

An operation declares its keys as templates filled from each job's payload::

    @operation("sync", keys=[Key("account:{account_id}", concurrency=2),
                             Key("api:{api_key}", rate=10, burst=20)])

and an enqueue may add its own (``enqueue(..., keys=["tenant:7"])``). A
template names payload fields only, by plain names (``{account_id}``), and
``{queue}`` or ``{operation}`` when the payload has no such field: no
attribute or index lookups, so a template cannot reach into objects.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobs.storable import text_problem

MAX_KEYS = 8
MAX_KEY_LENGTH = 200
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FORMATTER = string.Formatter()


def family(key: str) -> str:
    """The family a key's limits default to: the text before its first ``:``."""
    return key.split(":", 1)[0]


@dataclass(frozen=True)
class Key:
    """A key template and the limits its family gets when none are set yet.

    ``concurrency``: most jobs with one key running at once; ``rate`` and
    ``burst``: most started per second, and the bucket's size (default
    ``max(1, rate)``); ``weight``: turns per round of fair dispatch (2: twice
    as many starts as a key of weight 1 while both wait). Limits left None
    are not declared. The limits apply to every key of the family
    (``account:1``, ``account:2`` …, each on its own); an operator may change
    them at run time (``PATCH /keys/<name>``, the queues page).
    """

    template: str
    concurrency: int | None = None
    rate: float | None = None
    burst: float | None = None
    weight: float | None = None

    def __post_init__(self) -> None:
        problem = template_problem(self.template)
        if problem:
            raise ValueError(f"The key template {self.template!r} {problem}.")

    @property
    def family(self) -> str:
        return family(self.template)

    def limits(self) -> dict[str, Any]:
        """The limits this declaration sets (only those given)."""
        declared = {
            "concurrency": self.concurrency,
            "rate": self.rate,
            "burst": self.burst,
            "weight": self.weight,
        }
        return {name: value for name, value in declared.items() if value is not None}


def template_problem(template: Any) -> str | None:
    """Why ``template`` is not a usable key template, or None."""
    if not isinstance(template, str) or not template.strip():
        return "must be a non-empty string"
    try:
        parts = list(_FORMATTER.parse(template))
    except ValueError as error:
        return f"is not a template ({error})"
    for _literal, name, spec, conversion in parts:
        if name is None:
            continue
        if not _FIELD.match(name) or spec or conversion:
            return f"may name payload fields only, as {{field}} (not {{{name}}})"
    fam = family(template)
    if not fam or "{" in fam:
        return "must start with a fixed family name before its first ':' (account:{account_id})"
    return None


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot be a job's flow key, or None."""
    if not isinstance(key, str) or not key.strip():
        return "must be a non-empty string"
    if len(key) > MAX_KEY_LENGTH:
        return f"is longer than {MAX_KEY_LENGTH} characters"
    if not family(key):
        return "must not start with ':'"
    return text_problem(key)


def render(template: str, payload: Mapping[str, Any], *, queue: str, operation: str) -> str:
    """The key ``template`` names for this job; ``KeyError`` names a field it lacks.

    Payload values that are strings, whole numbers or booleans fill a field;
    anything else (objects, lists, floats) is refused as ``ValueError``, so
    equal keys never come from different spellings of one value.
    """
    out = []
    for literal, name, _spec, _conversion in _FORMATTER.parse(template):
        out.append(literal)
        if name is None:
            continue
        if name in payload:
            value = payload[name]
        elif name in ("queue", "operation"):
            value = queue if name == "queue" else operation
        else:
            raise KeyError(name)
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif not isinstance(value, str | int):
            raise ValueError(name)
        out.append(str(value))
    return "".join(out)


def job_keys(
    declared: Sequence[Key],
    given: Iterable[Any] | None,
    payload: Mapping[str, Any],
    *,
    queue: str,
    operation: str,
) -> tuple[list[str], list[str]]:
    """The job's keys (operation's first, then the enqueue's, without repeats) and errors."""
    keys: list[str] = []
    errors: list[str] = []
    templates: list[str] = [k.template for k in declared]
    if given is not None:
        if not isinstance(given, list | tuple):
            return [], ['keys must be a list of keys, such as ["account:42"].']
        for item in given:
            templates.append(item.template if isinstance(item, Key) else item)
    for template in templates:
        if not isinstance(template, str):
            errors.append(f"A key must be a string, not {type(template).__name__}.")
            continue
        try:
            key = render(template, payload, queue=queue, operation=operation)
        except KeyError as missing:
            errors.append(
                f"The key {template!r} names {missing.args[0]!r}, which the payload lacks."
            )
            continue
        except ValueError as bad:
            errors.append(
                f"The key {template!r} names {bad.args[0]!r}, whose value is not a string, "
                "a whole number or a boolean."
            )
            continue
        except (IndexError, AttributeError):
            errors.append(f"The key {template!r} is not a template.")
            continue
        problem = key_problem(key)
        if problem:
            errors.append(f"The key {key!r} {problem}.")
        elif key not in keys:
            keys.append(key)
    if len(keys) > MAX_KEYS:
        errors.append(f"A job may carry at most {MAX_KEYS} keys (it has {len(keys)}).")
    return keys, errors


def declared_keys(op: Any) -> tuple[Key, ...]:
    """An operation's declared keys (none for remote declarations)."""
    return tuple(getattr(op, "keys", ()) or ())


def check_declared(name: str, keys: Any) -> tuple[Key, ...]:
    """An operation's ``keys`` as registered: ``Key`` objects or templates; ``ValueError`` else."""
    if keys is None:
        return ()
    if isinstance(keys, str | Key):
        keys = [keys]
    out = []
    for item in keys:
        if isinstance(item, str):
            item = Key(item)
        if not isinstance(item, Key):
            raise ValueError(
                f"The operation {name!r} declares the key {item!r}; give jobs.flow_keys.Key "
                "objects or templates such as 'account:{account_id}'."
            )
        out.append(item)
    if len(out) > MAX_KEYS:
        raise ValueError(f"The operation {name!r} declares {len(out)} keys; at most {MAX_KEYS}.")
    return tuple(out)
