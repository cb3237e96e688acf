"""The live web view (``conclave serve``, ``conclave "Q" live=true``)."""
