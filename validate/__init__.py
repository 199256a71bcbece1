"""Validation: profiling, real torch runs, trace import and prediction-vs-measurement reports."""
