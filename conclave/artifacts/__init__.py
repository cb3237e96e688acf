"""Artifacts: the schema registry (loading, validation, recovery from a model's answer) and
the filter contract later rounds see them through."""
