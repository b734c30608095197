"""How a PostgreSQL ``DATABASES`` entry is adjusted for a transaction pooler (no database)."""

from __future__ import annotations

import dj_database_url
import pytest
from django.core.exceptions import ImproperlyConfigured

from jobs.pooling import configure_database

POOLER = "postgres://app:secret@pgbouncer:6432/controlplane"
DIRECT = "postgres://app:secret@postgres:5432/controlplane"


def entry(url: str = POOLER) -> dict:
    return dict(dj_database_url.parse(url))


def test_a_direct_url_to_another_server_means_transaction_pooling() -> None:
    config = configure_database(entry(), direct_url=DIRECT)
    assert config["POOLER"] == "transaction"
    assert config["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert config["OPTIONS"]["prepare_threshold"] is None
    assert config["DIRECT"]["HOST"] == "postgres"
    assert config["DIRECT"]["PORT"] == 5432
    assert config["DIRECT"]["POOLED_NAME"] == "controlplane"


def test_prepared_statements_are_turned_off_even_when_options_asked_for_them() -> None:
    config = entry()
    config["OPTIONS"] = {"prepare_threshold": 5}
    configure_database(config, pooler="transaction")
    assert config["OPTIONS"]["prepare_threshold"] is None


def test_without_a_pooler_nothing_changes() -> None:
    config = configure_database(entry(DIRECT))
    assert config["POOLER"] == "none"
    assert config["DISABLE_SERVER_SIDE_CURSORS"] is False
    assert "prepare_threshold" not in config.get("OPTIONS", {})
    assert "DIRECT" not in config


def test_a_direct_url_to_the_same_server_is_no_pooler() -> None:
    config = configure_database(entry(DIRECT), direct_url=DIRECT)
    assert config["POOLER"] == "none"
    assert config["DISABLE_SERVER_SIDE_CURSORS"] is False


def test_the_setting_overrides_the_guess() -> None:
    assert configure_database(entry(), direct_url=DIRECT, pooler="none")["POOLER"] == "none"
    config = configure_database(entry(), pooler="Transaction")
    assert config["POOLER"] == "transaction"
    assert "DIRECT" not in config  # pooled, no session to be had: workers only poll


def test_an_unknown_pooler_is_refused_with_the_choices() -> None:
    with pytest.raises(ImproperlyConfigured, match="none, transaction"):
        configure_database(entry(), pooler="session")
