"""Example third-party conclave plugin (used by conclave's own tests)."""
