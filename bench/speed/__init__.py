"""Speed benches: the search in process and through the CLI (up to 262,144 GPUs),
``configurator plan`` end to end on the 17-node logs, and the schedule simulator."""
