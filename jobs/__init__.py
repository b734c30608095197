"""Jobs: the models, the state machine, operations and enqueue."""
