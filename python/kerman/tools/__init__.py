"""Tools: what a tool is (:class:`Tool`), what its body gets (:class:`ToolContext`) and may
return (:class:`ToolResult`). The JSON Schema of a typed function is inferred from its signature
and docstring (``_infer``, ``_docstring``, ``_typed``), a given schema is checked (``_check``), and
a plan of several calls is awaited by ``_executor``."""

from ._context import ToolContext, ToolResult
from ._tool import Tool

__all__ = ["Tool", "ToolContext", "ToolResult"]
