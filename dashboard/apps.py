from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    label = "controlplane_dashboard"
    verbose_name = "Control plane dashboard"
