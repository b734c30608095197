"""Table names for the hand-written SQL (claims, transitions, enqueue, batches, the reaper).

They follow the app label (``controlplane``); ``tests/integration/foundation``
checks them against the models' ``db_table``. A module of constants only, so
the SQL modules can share them without importing each other.
"""

JOB_TABLE = "controlplane_job"
EVENT_TABLE = "controlplane_jobevent"
WORKER_TABLE = "controlplane_worker"
BATCH_MESSAGE_TABLE = "controlplane_batchmessage"
BATCH_RECEIPT_TABLE = "controlplane_batchreceipt"
REMOTE_OPERATION_TABLE = "controlplane_remoteoperation"
FLOW_KEY_TABLE = "controlplane_flowkey"
FAIR_LANE_TABLE = "controlplane_fairlane"
KEY_LIMIT_TABLE = "controlplane_keylimit"
WORKFLOW_TABLE = "controlplane_workflow"
DEPENDENCY_TABLE = "controlplane_dependency"
