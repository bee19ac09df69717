"""The front ends over the engine: the `rs-verify` CLI, the pytest plugin and the reports."""
