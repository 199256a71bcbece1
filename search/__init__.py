"""Planners that query the simulator as their cost oracle."""
