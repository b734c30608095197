"""The app listed last by ``configure``: see ``django_controlplane.apps.StartedConfig``."""
