"""Markdown, JSON-LD and terminal progress rendering."""
