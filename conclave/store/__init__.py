"""JSONL journal (hash chain), SQLite index and resume."""
