"""Adapters that plug sqbox into agent frameworks, importable without the frameworks installed.

- `sqbox.integrations.smolagents`: `SqboxExecutor`, a smolagents remote Python executor.
- `sqbox.integrations.monarch`: `SandboxedPythonCoder`, the torchforge coder actor.

Each uses its framework's base classes when the framework is installed and plain stand-ins
with the same interface when it is not.
"""
