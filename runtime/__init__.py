"""The engine room: Graph IR, passes, planner, executor, devices."""
