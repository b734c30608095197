from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs.conf import knob
        from jobs.operations import discover_operations

        discover_operations(list(knob("OPERATION_MODULES")))
