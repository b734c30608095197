"""Running ``manage.py jobs`` in the test process, with its output and exit code kept."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError


@dataclass(frozen=True)
class Run:
    """What one ``manage.py jobs …`` printed, and the exit code it would have ended with."""

    code: int
    out: str
    err: str

    def lines(self) -> list[str]:
        return self.out.splitlines()


def run_jobs(*args: str) -> Run:
    """``call_command("jobs", *args)``; a ``CommandError`` becomes its exit code and message.

    Usage errors argparse finds end with code 1 here (``call_command`` turns
    them into ``CommandError``); from a shell they exit 2, which
    ``test_real_process`` checks.
    """
    out, err = StringIO(), StringIO()
    try:
        call_command("jobs", *args, stdout=out, stderr=err)
    except CommandError as error:
        return Run(error.returncode, out.getvalue(), err.getvalue() + str(error))
    return Run(0, out.getvalue(), err.getvalue())


@pytest.fixture
def jobs() -> Callable[..., Run]:
    return run_jobs
