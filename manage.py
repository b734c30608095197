#!/usr/bin/env python
import gc
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    # Setting Django up makes a few hundred thousand objects that live as long as the
    # process (modules, classes, functions); the cyclic collector would walk them again
    # and again while they pile up: about a tenth of a worker's start-up CPU. It stays
    # off until the last app is ready (controlplane.apps.StartedConfig turns it back on).
    gc.disable()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
