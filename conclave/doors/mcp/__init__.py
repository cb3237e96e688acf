"""``conclave mcp``: conclave as a Model Context Protocol server, a thin door onto the same engine and journal.

Tool arguments come from a client (a coding agent, possibly steered by text it read), so they are treated as
untrusted: what the server's own command line sets (provider endpoints, roots) cannot be changed by a tool call,
file context must lie under the allowed roots, and everything sent is scrubbed as on the CLI.
"""
