import gc
import logging
import signal

from django.core.management.base import BaseCommand

from workers.config import ReaperConfig
from workers.management import BACKEND_CHECKS
from workers.reaper import Reaper


class Command(BaseCommand):
    help = (
        "Requeue or fail jobs whose worker died, hung or went silent; apply retention; "
        "fire periodic schedules (any number of reapers may run at once)."
    )
    requires_system_checks = BACKEND_CHECKS

    def add_arguments(self, parser) -> None:
        parser.add_argument("--interval", type=float, help="seconds between passes")
        parser.add_argument("--once", action="store_true", help="one pass, print counters, exit")

    def handle(self, *args, interval=None, once=False, **options) -> None:
        gc.freeze()  # set-up's objects live as long as the process: out of the collector's way
        logging.getLogger("workers").setLevel(logging.INFO)
        config = ReaperConfig(**({"interval_seconds": interval} if interval else {}))
        reaper = Reaper(config)
        if once:
            self.stdout.write(str(reaper.run_once()))
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: reaper.stopping.set())
        reaper.run()
