"""Documented re-export: MCP servers are the core's (:mod:`nexo_django.core.mcp`)."""

from .core.mcp import MCPManager, MCPServer, MCPTool

__all__ = ["MCPManager", "MCPServer", "MCPTool"]
