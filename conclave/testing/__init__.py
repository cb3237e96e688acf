"""Test helpers importable by plugin authors: the fake provider API server and fixtures."""
