"""Thin doors onto the engine and the store: the MCP server (mcp/) and the live web view (web/)."""
