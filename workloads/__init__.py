"""Workloads: model graphs with op-level costs, parallel plans and lowering."""
