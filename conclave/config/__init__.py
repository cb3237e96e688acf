"""The composed configuration: typed settings, the data home, and the guard every outside value
passes (MCP, web form, HTTP API)."""
