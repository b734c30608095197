"""The worker processes' commands (``runworker``, ``reaper``) and what they share."""

from django.core.checks import Tags

# The system checks of what a worker or reaper uses: the models and the database.
# The URL and admin checks import every view, the REST framework and the admin
# (a quarter of a second of CPU before a worker could claim); they belong to the
# web processes, whose commands run every check, as ``manage.py check`` does.
BACKEND_CHECKS = [Tags.models, Tags.database, Tags.compatibility, Tags.caches]
