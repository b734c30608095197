"""WORKER_CLASS resolves to a JobWorker subclass or says what to fix; NotNow checks its values."""

from __future__ import annotations

import math

import pytest
from django.core.exceptions import ImproperlyConfigured

from workers.config import check_worker_class, worker_class
from workers.engine import JobWorker
from workers.holding import NotNow


def test_the_default_and_a_subclass_resolve():
    assert worker_class() is JobWorker
    assert worker_class("") is JobWorker
    from tests.signal_app import HoldingWorker

    assert worker_class("tests.signal_app.HoldingWorker") is HoldingWorker


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("tests.signal_app.NoSuchWorker", "cannot be imported"),
        ("no_such_module.Worker", "cannot be imported"),
        ("tests.signal_app.NotAWorker", "not a subclass of workers.engine.JobWorker"),
        ("tests.signal_app.HOLD_REASON", "not a subclass of workers.engine.JobWorker"),
        (42, "as text"),
    ],
)
def test_a_bad_worker_class_is_a_clear_error_and_a_system_check(settings, path, words):
    with pytest.raises(ImproperlyConfigured, match=words):
        worker_class(path)
    settings.CONTROLPLANE = {"WORKER_CLASS": path}
    [error] = check_worker_class()
    assert error.id == "controlplane.E030" and words in error.msg


def test_the_check_passes_for_a_good_class(settings):
    settings.CONTROLPLANE = {"WORKER_CLASS": "tests.signal_app.HoldingWorker"}
    assert check_worker_class() == []


@pytest.mark.parametrize("seconds", [0, -1, math.inf, math.nan])
def test_not_now_needs_a_positive_finite_delay(seconds):
    with pytest.raises(ValueError, match="above 0"):
        NotNow(seconds, "why")


@pytest.mark.parametrize(("seconds", "reason"), [("5", "why"), (True, "why"), (5, None)])
def test_not_now_refuses_values_of_the_wrong_type(seconds, reason):
    with pytest.raises(TypeError):
        NotNow(seconds, reason)
