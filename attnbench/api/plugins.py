"""Users' mechanisms: plug-ins loaded from a file, a module or an installed package, in every process of a run.

Sources, in the order they load:

- ``--plugin SRC`` (repeatable) on every command that takes ``--attn``: ``SRC`` is a file (``my_attn.py``) or a
  dotted module (``mypkg.attn``), passed to :func:`activate`;
- ``ATTNBENCH_PLUGINS``: the same, separated as PATH is (``os.pathsep``);
- the entry-point group ``attnbench.attentions``, which installed packages declare in their own pyproject::

      [project.entry-points."attnbench.attentions"]
      mine = "mypkg.attn"

A plug-in registers with the built-ins' decorators (``register_attention``, ``register_feature_map``). After
loading, :func:`activate` writes the resolved sources (absolute file paths, module names) into
``ATTNBENCH_PLUGINS``, and this module's loader, the registry's look-up hook, loads that variable in every process, so
torchrun workers, submitit jobs, the scaling suite's child processes, lm-eval's process and a resumed run load the
same plug-ins without a flag.

Provenance: each plug-in is recorded with its source and the sha256 of its source text (:func:`provenance`); a
measured point whose attention names a plug-in's mechanism carries that hash in its identity
(:func:`identity`, used by :func:`attnbench.results.records.point_hash`), so editing the plug-in reruns its cells.
Built-ins add nothing to an identity.

Errors are one line (:class:`PluginError`): a missing file, a module that does not import (file and line of the
failure; ``ATTNBENCH_TRACEBACK=1`` appends the traceback), a name that clashes with a built-in or another plug-in
(both sources named), a class that misses the protocol (what is missing).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Iterable, Optional

from attnbench.api import registry
from attnbench.api.registry import Plugin, PluginError, plugin_for  # noqa: F401  (part of the plug-in API)

ENV = "ATTNBENCH_PLUGINS"
GROUP = "attnbench.attentions"
TRACEBACK_ENV = "ATTNBENCH_TRACEBACK"


_LOADED: dict[str, Plugin] = {}            # resolved source -> plug-in
_ENTRY_POINTS_DONE = False
_ENV_DONE: Optional[str] = None            # the value of ATTNBENCH_PLUGINS last loaded


def _want_traceback() -> bool:
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _looks_like_file(src: str) -> bool:
    return src.endswith(".py") or os.sep in src or (os.altsep is not None and os.altsep in src) or \
        Path(src).is_file()


def resolve(src: str) -> str:
    """The canonical form of a source: an absolute path for a file, the module name for a module."""
    src = src.strip()
    if not src:
        raise PluginError("--plugin: got an empty source; give a file (my_attn.py) or a module (mypkg.attn)")
    if Path(src).expanduser().is_dir():
        return str(Path(src).expanduser().resolve())
    if _looks_like_file(src):
        path = Path(src).expanduser()
        if not path.is_file():
            raise PluginError(f"--plugin {src}: no such file ({path.resolve()}); give a .py file, a folder or a "
                              f"dotted module")
        return str(path.resolve())
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", src):
        raise PluginError(f"--plugin {src!r}: not a file and not a dotted module name (e.g. my_attn.py, mypkg.attn)")
    return src


def env_sources() -> list[str]:
    """The sources named by ``ATTNBENCH_PLUGINS`` (empty entries ignored)."""
    return [s for s in os.environ.get(ENV, "").split(os.pathsep) if s.strip()]


def _module_name(path: str) -> str:
    """A stable module name for a plug-in file (the same in every process): its stem and a hash of its path."""
    stem = re.sub(r"\W", "_", Path(path).stem)
    return f"attnbench_plugin_{stem}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def _hash_text(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _module_hash(mod_name: str) -> str:
    """sha256 of a module's source: its file, or for a package every ``.py`` file under it (sorted paths)."""
    mod = sys.modules.get(mod_name)
    file = getattr(mod, "__file__", None)
    if not file:
        return _hash_text(mod_name.encode())
    path = Path(file)
    if path.name == "__init__.py":
        h = hashlib.sha256()
        for p in sorted(path.parent.rglob("*.py")):
            h.update(str(p.relative_to(path.parent)).encode() + b"\0" + p.read_bytes())
        return h.hexdigest()
    try:
        return _hash_text(path.read_bytes())
    except OSError:
        return _hash_text(mod_name.encode())


def _import_failure(src: str, exc: BaseException) -> PluginError:
    """One line: where the plug-in failed (its own deepest frame, else the deepest frame) and why."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}, line {exc.lineno}"
        why = f"SyntaxError: {exc.msg}"
    else:
        own = [f for f in frames if "importlib" not in f.filename and not f.filename.startswith("<frozen")]
        f = (own or frames or [None])[-1]
        where = f"{f.filename}, line {f.lineno}" if f is not None else src
        why = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    msg = f"plug-in {src} failed to import at {where}: {why}"
    if _want_traceback():
        msg += "\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    else:
        msg += f" (set {TRACEBACK_ENV}=1 for the traceback)"
    return PluginError(msg)


def _load_file(path: str, package: bool = False) -> Plugin:
    """Import a file under a stable module name; ``package``: ``path`` is a package's ``__init__.py`` (the plug-in
    is the folder, its hash covers every ``.py`` file under it)."""
    source = str(Path(path).parent) if package else path
    name = _module_name(source)
    if package:
        h = hashlib.sha256()
        for p in sorted(Path(source).rglob("*.py")):
            h.update(str(p.relative_to(source)).encode() + b"\0" + p.read_bytes())
        digest = h.hexdigest()
    else:
        digest = _hash_text(Path(path).read_bytes())
    plugin = Plugin(source=source, module=name, sha256=digest, kind="package" if package else "file")
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=[source] if package
                                                  else None)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a loader
        raise PluginError(f"plug-in {path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    registry._BY_MODULE[name] = plugin
    registry._LOADING.append(plugin)
    try:
        spec.loader.exec_module(module)
    except PluginError:
        _forget(plugin)
        raise
    except Exception as e:  # noqa: BLE001 - any import failure is one line naming the file and line
        _forget(plugin)
        raise _import_failure(path, e) from None
    finally:
        if registry._LOADING and registry._LOADING[-1] is plugin:
            registry._LOADING.pop()
    return plugin


def _load_module(name: str, kind: str = "module", source: Optional[str] = None) -> Plugin:
    placeholder = Plugin(source=source or name, module=name, sha256="", kind=kind)
    registry._LOADING.append(placeholder)
    try:
        already = name in sys.modules
        module = importlib.import_module(name)
    except PluginError:
        _forget(placeholder)
        raise
    except ModuleNotFoundError as e:
        _forget(placeholder)
        if e.name and name.startswith(e.name):
            raise PluginError(f"plug-in {source or name}: no module named {e.name!r} (is it installed, or on "
                              f"PYTHONPATH? a file needs its path, e.g. ./{name.replace('.', '/')}.py)") from None
        raise _import_failure(source or name, e) from None
    except Exception as e:  # noqa: BLE001
        _forget(placeholder)
        raise _import_failure(source or name, e) from None
    finally:
        if registry._LOADING and registry._LOADING[-1] is placeholder:
            registry._LOADING.pop()
    plugin = Plugin(source=source or name, module=name, sha256=_module_hash(module.__name__), kind=kind)
    registry._BY_MODULE[name] = plugin
    for key, p in list(registry._REGISTERED.items()):
        if p is placeholder:
            registry._REGISTERED[key] = plugin
    if already:  # imported before as an ordinary module: claim the classes it registered then
        for kind_, n, cls in registry._entries():
            mod = getattr(cls, "__module__", "")
            if (kind_, n) not in registry._REGISTERED and (mod == name or mod.startswith(name + ".")):
                registry._REGISTERED[(kind_, n)] = plugin
    return plugin


def _forget(plugin: Plugin) -> None:
    """Undo a failed import's registrations, so a corrected plug-in loads cleanly."""
    if plugin.kind in ("file", "package"):
        sys.modules.pop(plugin.module, None)
    registry._BY_MODULE.pop(plugin.module, None)
    for (kind, name), p in list(registry._REGISTERED.items()):
        if p is plugin:
            del registry._REGISTERED[(kind, name)]
            registry._unregister(kind, name)


def load(src: str) -> Plugin:
    """Import one plug-in (idempotent: a source already loaded is not imported again)."""
    key = resolve(src)
    if key in _LOADED:
        return _LOADED[key]
    registry._ensure_builtins()  # first the built-ins, so that a clash names the built-in
    if os.path.isdir(key):
        return _load_folder(key)
    before = set(registry._REGISTERED)
    plugin = _load_file(key) if os.path.isabs(key) else _load_module(key)
    _LOADED[key] = plugin
    new = [k for k in registry._REGISTERED if k not in before]
    registry._derive_feature_map_attentions([n for kind, n in new if kind == "feature map"], plugin)
    return plugin


def _load_folder(path: str) -> Plugin:
    """A folder: a package (with ``__init__.py``: imported as one module, its sub-modules relative to it), else
    every ``*.py`` file in it (sorted; names starting with ``_`` or ``test_`` are skipped)."""
    folder = Path(path)
    if (folder / "__init__.py").is_file():
        before = set(registry._REGISTERED)
        plugin = _load_file(str(folder / "__init__.py"), package=True)
        new = [k for k in registry._REGISTERED if k not in before]
        registry._derive_feature_map_attentions([n for kind, n in new if kind == "feature map"], plugin)
    else:
        files = [p for p in sorted(folder.glob("*.py")) if not p.name.startswith(("_", "test_"))]
        if not files:
            raise PluginError(f"--plugin {path}: the folder has no .py file and no __init__.py")
        for f in files:
            load(str(f))
        h = hashlib.sha256("".join(_LOADED[str(f.resolve())].sha256 for f in files).encode()).hexdigest()
        plugin = Plugin(source=path, module="", sha256=h, kind="folder")
    _LOADED[path] = plugin
    return plugin


def load_entry_points() -> list[Plugin]:
    """Import every module that installed packages declare in the entry-point group ``attnbench.attentions``
    (once per process)."""
    global _ENTRY_POINTS_DONE
    if _ENTRY_POINTS_DONE:
        return []
    _ENTRY_POINTS_DONE = True
    from importlib import metadata

    out = []
    for ep in metadata.entry_points(group=GROUP):
        module = ep.value.split(":", 1)[0].strip()
        if module in _LOADED:
            continue
        registry._ensure_builtins()
        before = set(registry._REGISTERED)
        label = f"entry point {ep.name} = {ep.value}" + (f" (from {ep.dist.name})" if getattr(ep, "dist", None)
                                                           else "")
        plugin = _load_module(module, kind="entry point", source=module)
        try:
            if ":" in ep.value:
                ep.load()
        except Exception as e:  # noqa: BLE001
            raise _import_failure(label, e) from None
        _LOADED[module] = plugin
        new = [k for k in registry._REGISTERED if k not in before]
        registry._derive_feature_map_attentions([n for kind, n in new if kind == "feature map"], plugin)
        out.append(plugin)
    return out


def _load_env() -> None:
    """Load ``ATTNBENCH_PLUGINS`` (again whenever it changed) and the entry points."""
    global _ENV_DONE
    value = os.environ.get(ENV, "")
    if value != _ENV_DONE:
        _ENV_DONE = value
        for src in env_sources():
            load(src)
    load_entry_points()


def _export() -> None:
    global _ENV_DONE
    sources = list(dict.fromkeys(p.source for p in _LOADED.values() if p.kind != "entry point"))
    if sources:
        os.environ[ENV] = os.pathsep.join(sources)
        _ENV_DONE = os.environ[ENV]


def activate(sources: Iterable[str] = ()) -> list[Plugin]:
    """Load the plug-ins ``sources`` (files or dotted modules), those in ``ATTNBENCH_PLUGINS`` and the installed
    entry points; then export every loaded source (absolute paths, module names) in ``ATTNBENCH_PLUGINS`` so that
    every child process loads the same. Idempotent. Returns the plug-ins loaded in this process."""
    registry._ensure_loaded()  # built-ins, the environment's plug-ins, the entry points
    for src in sources or ():
        load(src)
    _export()
    return list(_LOADED.values())


def configured(sources: Iterable[str] = ()) -> bool:
    """Whether this process has plug-ins to load (sources, ``ATTNBENCH_PLUGINS`` or an installed entry point),
    without importing any of them: commands that can answer without torch ask this first."""
    if list(sources or ()) or env_sources() or _LOADED:
        return True
    from importlib import metadata

    return bool(list(metadata.entry_points(group=GROUP)))


def loaded() -> list[Plugin]:
    """The plug-ins loaded in this process."""
    return list(_LOADED.values())


# --- provenance -----------------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def _tokens(obj: Any) -> set[str]:
    if isinstance(obj, str):
        return set(_TOKEN.findall(obj))
    if isinstance(obj, dict):
        return set().union(*(_tokens(k) | _tokens(v) for k, v in obj.items())) if obj else set()
    if isinstance(obj, (list, tuple, set)):
        return set().union(*(_tokens(v) for v in obj)) if obj else set()
    return set()


def identity(attention: str, options: Any = None) -> dict[str, str]:
    """``{mechanism: sha256 of its plug-in's source}`` for the plug-in mechanisms that ``attention`` (a name or
    label such as ``deltanet+mymap``) and ``options`` name; empty for built-ins. Part of a point's identity: keyed
    by name, not by path: moving the file keeps its results, editing it reruns them."""
    return {name: p.sha256 for (kind, name), p in sorted(_used(attention, options))}


def _used(attention: str, options: Any) -> list[tuple[tuple[str, str], Plugin]]:
    if not (registry._REGISTERED or os.environ.get(ENV)):
        return []
    if os.environ.get(ENV) and os.environ.get(ENV, "") != (_ENV_DONE or ""):
        registry._ensure_loaded()
    words = _tokens(attention) | _tokens(options)
    return [(key, p) for key, p in registry._REGISTERED.items() if key[1] in words]


def provenance(attention: str, options: Any = None) -> dict[str, str]:
    """What a record carries for the plug-ins it uses: ``{"plugin:<file or module>": "sha256:<hash>"}``."""
    return {f"plugin:{p.source}": f"sha256:{p.sha256}" for _, p in _used(attention, options)}


registry.LOOKUP_HOOKS.append(_load_env)
