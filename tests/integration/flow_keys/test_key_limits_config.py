"""Key limits declared in code (CONTROLPLANE["KEYS"], operations' Key(...)): applied at start
when the declaration changed, audited; an operator's change stands until then. Both databases."""

from __future__ import annotations

import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured

from jobs import audit
from jobs.flow_keys import Key
from jobs.key_limits import KeyLimitError, apply_declared_limits, check_limits, declared_limits
from jobs.models import KeyLimit, OperatorAction
from jobs.operations import operation, registry
from jobs.operator_actions import set_key_limits
from workers.config import check_key_limits

pytestmark = pytest.mark.django_db(transaction=True)


def test_settings_apply_once_and_an_operators_change_stands(settings):
    fam = f"f{uuid.uuid4().hex[:6]}"
    settings.CONTROLPLANE = {"KEYS": {fam: {"concurrency": 2}}}
    assert fam in apply_declared_limits()
    assert KeyLimit.objects.get(name=fam).concurrency == 2
    set_key_limits(fam, {"concurrency": 5}, user="alice")
    assert fam not in apply_declared_limits()  # unchanged declaration: the operator's 5 stands
    assert KeyLimit.objects.get(name=fam).concurrency == 5
    settings.CONTROLPLANE = {"KEYS": {fam: {"concurrency": 3, "rate": 1.5}}}
    assert fam in apply_declared_limits()
    row = KeyLimit.objects.get(name=fam)
    assert (row.concurrency, row.rate) == (3, 1.5)
    actions = list(
        OperatorAction.objects.filter(target=fam)
        .order_by("at", "id")
        .values_list("action", "username")
    )
    assert actions == [
        (audit.APPLY_KEY_SETTINGS, "settings"),
        (audit.SET_KEY_LIMITS, "alice"),
        (audit.APPLY_KEY_SETTINGS, "settings"),
    ]


def test_operations_that_disagree_on_a_family_are_refused():
    fam = f"f{uuid.uuid4().hex[:6]}"
    names = [f"cfg.{uuid.uuid4().hex[:6]}" for _ in range(2)]
    operation(names[0], keys=[Key(fam + ":{a}", concurrency=1)])(lambda ctx, p: None)
    operation(names[1], keys=[Key(fam + ":{b}", concurrency=2)])(lambda ctx, p: None)
    try:
        with pytest.raises(ImproperlyConfigured, match=fam):
            declared_limits()
        assert check_key_limits()[0].id == "controlplane.E031"
    finally:
        for name in names:
            registry.unregister(name)
    assert check_key_limits() == []


@pytest.mark.parametrize(
    "values",
    [
        {"concurrency": 0},
        {"concurrency": True},
        {"concurrency": 1.5},
        {"rate": float("nan")},
        {"rate": 10**400},
        {"burst": 0.5},
        {"weight": 0},
        {"colour": 1},
    ],
)
def test_limits_outside_their_rules(values):
    with pytest.raises(KeyLimitError) as error:
        check_limits(values)
    assert set(error.value.errors) == set(values)


def test_a_template_must_start_with_a_family():
    for bad in ("{account_id}", "a:{x.y}", "a:{x[0]}", "a:{x!r}", ""):
        with pytest.raises(ValueError):
            Key(bad)
