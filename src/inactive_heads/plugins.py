"""Plugins: Python files or modules whose import registers score functions and tasks."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import InactiveHeadsError

__all__ = ["PluginError", "load_plugins"]


class PluginError(InactiveHeadsError):
    """A plugin that does not exist or fails to import; the message names it (and the line of a syntax error)."""


def load_plugins(plugins: Sequence[str]) -> None:
    """Import each plugin (a ``.py`` file or a module name) so its ``register_score``/``register_task`` calls run.

    A file already loaded in this process is not run again (that would register its names twice).
    """
    for plugin in plugins:
        if plugin.endswith(".py"):
            path = Path(plugin)
            if not path.is_file():
                raise PluginError(f"plugin file {path} does not exist")
            name = f"inactive_heads_plugin_{path.stem}"
            loaded = getattr(sys.modules.get(name), "__file__", None)
            if loaded is not None and Path(loaded).resolve() == path.resolve():
                continue  # loaded by an earlier call in this process; running it again would re-register its names
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None  # a .py path always has a source loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                sys.modules.pop(spec.name, None)
                raise PluginError(f"plugin {path} failed to load: {_describe(e)}") from None
        else:
            try:
                importlib.import_module(plugin)
            except ModuleNotFoundError as e:
                if e.name != plugin:
                    raise PluginError(f"plugin module {plugin!r} failed to load: {_describe(e)}") from None
                msg = f"plugin module {plugin!r} not found ({e}); pass a .py file or an importable module"
                raise PluginError(msg) from None
            except Exception as e:
                raise PluginError(f"plugin module {plugin!r} failed to load: {_describe(e)}") from None


def _describe(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return f"SyntaxError at {e.filename}, line {e.lineno}: {e.msg}"
    return f"{type(e).__name__}: {e}"
