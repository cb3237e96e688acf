"""The JSON Schemas of the built-in strategies' own artifacts (answer, explore, adversarial, devil's advocate):
registered through ``register_schemas`` by the plugin that plays them, as a third-party strategy would."""
