"""conclave's built-in plugins (providers, strategies, filters, progress), installed as ``conclave_plugins``.

Each module registers through the ``conclave`` entry-point group, exactly as a third-party plugin would.
"""
