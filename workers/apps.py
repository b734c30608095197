from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    label = "controlplane_workers"
    verbose_name = "Control plane workers"
