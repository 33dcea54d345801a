"""Kerman under other agent frameworks, on their public extension surfaces (docs/frameworks.md).

Each integration is a module of its own, imported by name, and needs its framework's extra:

- ``kerman.integrations.openai_agents`` (``kerman[openai-agents]``): ``KermanSession``, the
  openai-agents ``Session`` protocol over a Kerman session log.
- ``kerman.integrations.pydantic_ai`` (``kerman[pydantic-ai]``): ``KermanDurability``, a
  pydantic-ai durable-execution engine journalling a run's units in a Kerman session log.

``import kerman`` and ``import kerman.integrations`` import no framework.
"""
