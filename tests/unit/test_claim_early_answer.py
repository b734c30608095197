"""A parked claim that finds nothing answers spread out, never more than a tenth (or 0.5 s)
before its wait is up."""

from __future__ import annotations

from django_controlplane.remote.claim_view import EARLY_ANSWER_MAX_SECONDS, early_answer


def test_an_early_answer_is_at_most_a_tenth_of_the_wait_and_half_a_second():
    for wait in (0.6, 1.0, 5.0, 30.0):
        answers = [early_answer(wait) for _ in range(2000)]
        bound = min(EARLY_ANSWER_MAX_SECONDS, wait / 10)
        assert all(0.0 <= a <= bound for a in answers), wait
        # Spread over the bound, not bunched at one point.
        assert min(answers) < bound * 0.1 and max(answers) > bound * 0.9, wait
