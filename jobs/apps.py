from django.apps import AppConfig


class JobsConfig(AppConfig):
    """The control plane's models, state machine, API and operations.

    The label (and so the table prefix, ``controlplane_job``…, and the permission
    names, ``controlplane.view_job``…) is ``controlplane`` rather than the package
    name, so the app sits beside a host project's own ``jobs`` app.
    """

    name = "jobs"
    label = "controlplane"
    verbose_name = "Control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        if not getattr(settings, "CHANNEL_LAYERS", None):
            # The live pushes (dashboard, remote-worker wake-ups) fan out inside one
            # process (each process relays from the database itself), so a project
            # that set no channel layer gets the in-memory one rather than none.
            settings.CHANNEL_LAYERS = {
                "default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}
            }

        from jobs.conf import knob
        from jobs.operations import discover_operations

        discover_operations(list(knob("OPERATION_MODULES")))
