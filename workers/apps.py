import gc

from django.apps import AppConfig

# Whether this app switched the cyclic collector off for the set-up (WorkersConfig).
_collector_paused = False


class WorkersConfig(AppConfig):
    """The worker and reaper commands; also keeps the cyclic collector out of Django's set-up.

    Setting Django up makes a few hundred thousand objects that live as long
    as the process (modules, classes, functions, model fields), and the
    collector walks them again and again while they pile up: about 55 ms of
    CPU before a worker could claim in a fresh ``startproject`` host. This is
    the first app of ``django_controlplane.APPS``, so its config is made before the
    other apps' modules load: the collector is off from there (the other apps'
    packages, every ``models`` module) to this app's ``ready()``, the first of
    the ready phase, which freezes what set-up made (later collections, and the
    pages of forked ``runworker --processes`` children, leave it alone) and
    switches the collector back on. Nothing in between makes garbage worth
    collecting. A process whose collector was off already (its own choice) is
    left as it was.
    """

    name = "workers"
    label = "controlplane_workers"
    verbose_name = "Control plane workers"

    def __init__(self, app_name: str, app_module: object) -> None:
        global _collector_paused
        super().__init__(app_name, app_module)
        if gc.isenabled():
            gc.disable()
            _collector_paused = True

    def ready(self) -> None:
        global _collector_paused
        from django.core import checks

        from workers.config import check_key_limits, check_worker_class

        checks.register(check_worker_class, checks.Tags.compatibility)
        checks.register(check_key_limits, checks.Tags.compatibility)
        if _collector_paused:
            _collector_paused = False
            gc.freeze()
            gc.enable()
