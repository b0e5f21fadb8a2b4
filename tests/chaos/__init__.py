"""Fault-injection ("chaos") suite: a history checker, a nemesis, a workload and named schedules."""
