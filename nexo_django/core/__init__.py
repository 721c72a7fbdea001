"""The harness: agent loop, permissions, tools, sandboxes, model providers, MCP client.

Plain Python: nothing here imports Django (the import contract in pyproject.toml checks it).
"""
