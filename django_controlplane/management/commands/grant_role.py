"""Give a user one of the control plane's roles without opening the Django admin.

Roles are Django groups holding the permissions the API and the dashboard
check, so an operator can also manage them in the admin afterwards.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from jobs.models import Job

ROLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "viewer": ("Control plane viewers", ("view_job",)),
    "operator": ("Control plane operators", ("view_job", "add_job", "change_job")),
    "remote-worker": ("Control plane remote workers", ("run_remote_jobs",)),
}


def role_group(role: str) -> Group:
    """The group of ``role``, created with its permissions on first use."""
    name, codenames = ROLES[role]
    group, _ = Group.objects.get_or_create(name=name)
    group.permissions.add(
        *Permission.objects.filter(
            content_type__app_label=Job._meta.app_label, codename__in=codenames
        )
    )
    return group


class Command(BaseCommand):
    help = (
        "Give USER a role: viewer (sees everything, changes nothing), operator (may enqueue, "
        "cancel, retry, pause and requeue) or remote-worker (may serve jobs over HTTP)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("role", choices=sorted(ROLES))
        parser.add_argument(
            "--create", action="store_true", help="Create the user if it does not exist."
        )
        parser.add_argument("--password", help="Set this password (with --create or not).")

    def handle(
        self, *args, username: str, role: str, create: bool, password: str | None, **options
    ) -> None:
        User = get_user_model()
        with transaction.atomic():
            try:
                user = User.objects.get(username=username)
            except User.DoesNotExist:
                if not create:
                    raise CommandError(
                        f"No user named {username!r}. Pass --create to create it."
                    ) from None
                user = User.objects.create_user(username=username)
            if password is not None:
                user.set_password(password)
                user.save(update_fields=["password"])
            user.groups.add(role_group(role))
        self.stdout.write(f"{username} now has the {role} role ({ROLES[role][0]}).")
