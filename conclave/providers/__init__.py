"""The provider contract, HTTP helpers (retry, SSE), hedging, health and pricing."""
