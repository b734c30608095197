"""A built-in SECRET_KEY with DEBUG off is a system-check warning, not silence."""

from __future__ import annotations

from django.test import override_settings

from django_controlplane.checks import BUILT_IN_SECRET_KEYS, check_secret_key


def test_the_built_in_key_with_debug_off_is_a_warning() -> None:
    for key in (BUILT_IN_SECRET_KEYS[0], "django-insecure-abc"):
        with override_settings(DEBUG=False, SECRET_KEY=key):
            [warning] = check_secret_key()
        assert warning.id == "controlplane.W001" and "DJANGO_SECRET_KEY" in warning.hint


def test_a_real_key_or_debug_on_says_nothing() -> None:
    with override_settings(DEBUG=True, SECRET_KEY=BUILT_IN_SECRET_KEYS[0]):
        assert check_secret_key() == []
    with override_settings(DEBUG=False, SECRET_KEY="k" * 60 + "9f3Zq"):
        assert check_secret_key() == []
