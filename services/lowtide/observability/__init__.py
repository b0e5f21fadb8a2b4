"""Observability as code: Grafana dashboards, Prometheus alert rules, and a local Prometheus."""
