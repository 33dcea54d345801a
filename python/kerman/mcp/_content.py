"""MCP content (tool results, resources, prompt messages) as Kerman content blocks.

Kerman's providers understand two kinds of block in a tool result or a user message: text
(``{"type": "text", "text": ...}``) and images (``{"type": "image", "mediaType", "data"}``).
Everything else an MCP server may return is turned into one of those: audio and binary
resources become a text line naming what they are (no provider here takes audio in a tool
result), embedded text resources their text under a header naming the URI, resource links a
line naming the link. The raw structured content goes to the result's ``meta`` (logged with the
result) and, when the server gave no text, to a JSON text block the model reads.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Dict, List, Optional, Sequence, Union

__all__ = ["blocks_of", "content_of", "result_meta", "resource_blocks"]


def _text(text: str) -> Dict[str, Any]:
    return {"type": "text", "text": text}


def _size(data: str) -> int:
    """The decoded size of base64 ``data`` (without decoding it)."""
    stripped = data.rstrip("=")
    return len(stripped) * 3 // 4


def _resource_contents(contents: Any) -> Dict[str, Any]:
    """One ``TextResourceContents`` / ``BlobResourceContents`` as one block."""
    uri = str(contents.uri)
    mime = getattr(contents, "mime_type", None)
    text = getattr(contents, "text", None)
    if text is not None:
        header = f"[resource {uri}" + (f" ({mime})" if mime else "") + "]"
        return _text(f"{header}\n{text}")
    blob = getattr(contents, "blob", "") or ""
    if mime and mime.startswith("image/"):
        return {"type": "image", "mediaType": mime, "data": blob}
    return _text(f"[binary resource {uri} ({mime or 'unknown type'}), {_size(blob)} bytes, not shown]")


def block_of(item: Any) -> Dict[str, Any]:
    """One MCP content block (text, image, audio, embedded resource, resource link)."""
    kind = getattr(item, "type", None)
    if kind == "text":
        return _text(item.text)
    if kind == "image":
        return {"type": "image", "mediaType": item.mime_type, "data": item.data}
    if kind == "audio":
        return _text(f"[audio ({item.mime_type}), {_size(item.data)} bytes, not shown]")
    if kind == "resource":
        return _resource_contents(item.resource)
    if kind == "resource_link":
        mime = f" ({item.mime_type})" if getattr(item, "mime_type", None) else ""
        about = f": {item.description}" if getattr(item, "description", None) else ""
        return _text(f"[resource link {item.name} <{item.uri}>{mime}{about}]")
    return _text(f"[unsupported MCP content {kind!r}]")


def blocks_of(content: Sequence[Any], structured: Any = None) -> List[Dict[str, Any]]:
    """The Kerman blocks of an MCP result's ``content`` (and ``structuredContent``)."""
    blocks = [block_of(item) for item in content]
    if structured is not None and not any(getattr(item, "type", None) == "text" for item in content):
        blocks.append(_text(json.dumps(structured, ensure_ascii=False)))
    if not blocks:
        blocks.append(_text(""))
    return blocks


def content_of(content: Sequence[Any], structured: Any = None) -> Union[str, List[Dict[str, Any]]]:
    """A ``ToolResult``'s content for an MCP result: its blocks (``blocks_of``), or the text
    of a result that is one text block. The loop logs a text result as that same one block,
    but builds its message straight as JSON, where a list of blocks is kept as parsed maps
    (about 2 KB more a call, which the process page-faults in as its log grows), for the
    commonest MCP result."""
    if len(content) == 1 and getattr(content[0], "type", None) == "text":  # structuredContent goes to the meta
        return str(content[0].text)
    return blocks_of(content, structured)


def result_meta(server: str, tool: str, result: Any, progress: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """What the log keeps of an MCP call besides the blocks the model reads: the server, the
    tool's own name, ``structuredContent``, the media that had no block of their own, and the
    progress the server reported."""
    mcp: Dict[str, Any] = {"server": server, "tool": tool}
    if result is not None:
        if result.structured_content is not None:
            mcp["structuredContent"] = result.structured_content
        media = [
            {"type": "audio", "mimeType": item.mime_type, "bytes": _size(item.data)}
            for item in result.content
            if getattr(item, "type", None) == "audio"
        ]
        if media:
            mcp["media"] = media
    if progress:
        mcp["progress"] = list(progress)
    return {"mcp": mcp}


def resource_blocks(result: Any) -> List[Dict[str, Any]]:
    """A ``ReadResourceResult`` as blocks for a ``UserMessage``."""
    return [_resource_contents(c) for c in result.contents] or [_text("")]


def decode_blob(data: Optional[str]) -> bytes:
    """Base64 ``data`` as bytes (for callers that want a binary resource's bytes)."""
    return base64.b64decode(data or "")
