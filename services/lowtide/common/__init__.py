"""Plumbing shared by every service: gRPC server scaffolding, logging, processes."""
