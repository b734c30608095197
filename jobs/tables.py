"""Table names for the hand-written SQL of the hot paths (claims, transitions).

They follow the app label (``controlplane``); ``tests/integration/foundation``
checks them against the models' ``db_table``. A module of constants only, so
the SQL modules can share them without importing each other.
"""

JOB_TABLE = "controlplane_job"
EVENT_TABLE = "controlplane_jobevent"
