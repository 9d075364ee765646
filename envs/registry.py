"""Env registry: `register(id, entry_point="pkg.mod:Class", **defaults)`, `make(id, **kwargs)`, `registered()`.

Environments are registered by string and imported only when made, so listing ids stays cheap and a broken
third-party env cannot break the others. Packages (agentrl's own built-ins included) register through the
Python entry-point group ``agentrl.envs``: the entry point's name is the env id, its value the class::

    [project.entry-points."agentrl.envs"]
    my-env = "my_package.my_env:MyEnv"

Entry points are read once, on the first call to `make` or `registered`; an explicit `register` call with the same
id wins over an entry point.

An unregistered env can be named by where its class lives, as Gymnasium's ``make("module:Id")`` does:
``"my_package.my_env:MyEnv"`` (imported with importlib, so it must be importable from `sys.path`) or
``"path/to/my_env.py:MyEnv"`` (a file, relative to the current folder or absolute, imported as module ``my_env``).
The `agentrl` command puts its ``--app-dir`` (default: the current folder) first on `sys.path` through `use_app_dir`,
as uvicorn and gunicorn do, so ``pkg.mod:Class`` resolves from the folder the command is typed in.
Such ids are not listed by `registered`. Neither is a served env's URL, ``http://HOST:PORT/NAME`` (see
`agentrl.envs.remote`): its spec stands a `RemoteEnv` class in for the env served there; nor an OpenEnv server's,
``openenv+http://HOST:PORT`` (`agentrl.envs.openenv.OpenEnvEnv`).

An env whose code needs a package that the base install leaves out (WebShop's faiss, the GUI's Playwright) fails to
load with `EnvExtraError`: one line naming the package and the extra that installs it (`agentrl.extras`).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import logging
import os
import site
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

from agentrl.envs.core import TextEnv
from agentrl.envs.difficulty import Difficulty
from agentrl.extras import MissingExtraError, missing_extra_message

ENTRY_POINT_GROUP = "agentrl.envs"

__all__ = ["EnvSpec", "UnknownEnvError", "EnvLoadError", "EnvExtraError", "register", "make", "registered", "spec",
           "short_name", "loaded_env_code", "use_app_dir", "loading", "difficulty_of"]

log = logging.getLogger(__name__)


class UnknownEnvError(KeyError):
    """Raised by `make` / `spec` for an id nobody registered; the message lists the known ids."""

    def __str__(self) -> str:  # KeyError would repr() the message and show quotes
        return str(self.args[0])


class EnvLoadError(UnknownEnvError):
    """Raised by `make` / `spec` for a ``module:Class`` or ``file.py:Class`` id that cannot be loaded.

    The message is one line naming the id, the file (and line) that failed, and what was wrong. It subclasses
    `UnknownEnvError` so that callers reporting a bad ``--env`` catch both.
    """


class EnvExtraError(EnvLoadError):
    """Raised when an env's code needs an optional package that this install left out.

    The message is one line naming the env (or its feature), the package and the command that installs its extra,
    e.g. "the webshop env needs faiss, which the base install leaves out: pip install 'agentrl-platform[webshop]'".
    The command line is right and the install is not, so the CLI exits 1 on it, not 2.
    """


@dataclass(frozen=True)
class EnvSpec:
    """What the registry knows about one env id.

    Attributes:
        id: the name passed to `make`.
        entry_point: ``"pkg.module:ClassName"`` or the class / factory itself.
        defaults: keyword arguments passed to the constructor unless `make` overrides them.
        package: the distribution that provides it (``"agentrl-platform"`` for the built-ins), for `agentrl envs list`.
        py_modules: local code that other processes need to import `entry_point` (a ``.py`` file or a package
            folder), for ids naming a module or file that no installed distribution provides. Ray runners receive
            it through their runtime environment (``runtime_env={"py_modules": ...}``).
    """

    id: str
    entry_point: str | Callable[..., TextEnv]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    package: str = ""
    py_modules: tuple[str, ...] = ()

    def load(self) -> Callable[..., TextEnv]:
        """Import and return the env class (or factory).

        Raises:
            EnvExtraError: the env's module imports a package that this install left out.
            ImportError: any other failure to import it.
        """
        if not isinstance(self.entry_point, str):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        if not attr:
            raise ValueError(f"env {self.id!r}: entry point {self.entry_point!r} must look like 'pkg.module:Class'")
        try:
            with loading(self.id):
                module = importlib.import_module(module_name)
        except ImportError as e:
            raise ImportError(f"env {self.id!r}: cannot import {module_name!r} ({e})") from e
        with loading(self.id):  # a package's lazy __getattr__ (PEP 562, as agentrl.envs.webshop) imports here
            try:
                return getattr(module, attr)
            except AttributeError:
                raise ImportError(f"env {self.id!r}: module {module_name!r} has no attribute {attr!r}") from None

    @property
    def description(self) -> str:
        """First line of the env class docstring (imports the env)."""
        doc = inspect.getdoc(self.load()) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


_specs: dict[str, EnvSpec] = {}
_entry_points_loaded = False
_loaded_code: dict[str, None] = {}  # py_modules of the module:Class / file.py:Class envs loaded, in load order


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _specs:  # explicit register() wins
            continue
        package = ep.dist.name if ep.dist is not None else ""
        _specs[ep.name] = EnvSpec(id=ep.name, entry_point=ep.value, package=package)
    log.debug("env entry points (group %s): %s", ENTRY_POINT_GROUP, ", ".join(sorted(_specs)) or "(none)")


def use_app_dir(folder: str | os.PathLike[str] = ".") -> str:
    """Put `folder` first on `sys.path`, so ``pkg.mod:Class`` env ids and ``--agent pkg.mod:function`` import from it.

    A console script's ``sys.path[0]`` is the folder of the script (the venv's ``bin/``), not the current folder as
    for ``python -m``: without this, ``--env examples.my_env:MyEnv`` typed in a checkout fails with "No module named
    'examples'". uvicorn's and gunicorn's ``--app-dir`` (default ``"."``) do the same.

    Args:
        folder: the folder to import from (relative to the current folder, or absolute).

    Returns:
        The folder as an absolute path.

    Raises:
        ValueError: `folder` is not an existing folder.
    """
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise ValueError(f"--app-dir {str(folder)!r} is not a folder; name the folder your module:Class ids import "
                         f"from (default: the current folder)")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    log.debug("--app-dir: importing module:attr names from %s first", path)
    return str(path)


def register(id: str, entry_point: str | Callable[..., TextEnv], **defaults: Any) -> EnvSpec:
    """Register an env under `id`; `make(id)` will call `entry_point(**defaults, **kwargs)`.

    Args:
        id: the env id, e.g. ``"my-maze"``. Re-registering an id replaces it.
        entry_point: ``"pkg.module:ClassName"`` (imported lazily) or a class / factory.
        **defaults: constructor keyword arguments used unless `make` overrides them.
    """
    if not isinstance(id, str) or not id:
        raise ValueError(f"env id must be a non-empty string, got {id!r}")
    caller = inspect.getmodule(inspect.stack()[1][0])
    package = (caller.__name__.split(".")[0] if caller else "") or ""
    spec_ = EnvSpec(id=id, entry_point=entry_point, defaults=MappingProxyType(dict(defaults)), package=package)
    _specs[id] = spec_
    return spec_


def registered() -> Mapping[str, EnvSpec]:
    """All registered specs by id, sorted by id (built-ins and entry points included)."""
    _load_entry_points()
    return MappingProxyType(dict(sorted(_specs.items())))


def spec(id: str) -> EnvSpec:
    """The spec registered under `id`, or the spec of a ``module:Class`` / ``path/to/file.py:Class`` id.

    Raises:
        UnknownEnvError: a plain id nobody registered (the message names the closest known id).
        EnvLoadError: a ``module:Class`` or ``file.py:Class`` id whose code cannot be imported, lacks the class, or
            whose class is not a `TextEnv` subclass.
    """
    _load_entry_points()
    if id in _specs:
        return _specs[id]
    if id.startswith(("http://", "https://")):
        return _remote_spec(id)
    if id.startswith(("openenv+http://", "openenv+https://", "openenv+ws://", "openenv+wss://")):
        return EnvSpec(id=id, entry_point="agentrl.envs.openenv:OpenEnvEnv",
                       defaults=MappingProxyType({"base_url": id}), package="openenv")
    if ":" in id:
        return _import_spec(id)
    known = sorted(_specs)
    close = difflib.get_close_matches(id, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownEnvError(f"unknown env {id!r}.{hint} Known envs: {', '.join(known) or '(none)'}")


def make(id: str, **kwargs: Any) -> TextEnv:
    """Create the env registered under `id`, with `kwargs` overriding the registered defaults.

    Raises:
        UnknownEnvError, EnvLoadError: as `spec`.
        EnvExtraError: the env's code, or a feature that `kwargs` ask for, needs a package this install left out.
    """
    s = spec(id)
    with loading(id):
        factory = s.load()
        return factory(**{**s.defaults, **kwargs})


def difficulty_of(id: str, kwargs: Mapping[str, Any] | None = None) -> Difficulty | None:
    """The difficulty levels env `id` built with `kwargs` plays, or None when it declares none.

    `TextEnv.difficulty_for`: its declared `TextEnv.difficulty_levels`, narrowed by an argument such as
    ``task_types``.

    Imports the env's class (as `make` does) but builds no env. A factory that is not a class, and a served env's
    stand-in class, declare none.

    Raises:
        UnknownEnvError, EnvLoadError, EnvExtraError: as `spec` and `make`.
        ValueError: `kwargs` (or the registered defaults) narrow the levels to ones the env does not have.
    """
    s = spec(id)
    with loading(id):
        factory = s.load()
    if not isinstance(factory, type) or not isinstance(getattr(factory, "difficulty_levels", None), Difficulty):
        return None
    narrow = getattr(factory, "difficulty_for", None)  # with the arguments `make` would pass, defaults included
    return narrow({**s.defaults, **(kwargs or {})}) if narrow is not None else factory.difficulty_levels


@contextmanager
def loading(env_id: str) -> Iterator[None]:
    """Report a package missing while importing or building env `env_id` as `EnvExtraError` naming its extra.

    `make` and `EnvSpec.load` use it; code that builds envs from `EnvSpec.load`'s class itself (the env server)
    wraps its first build in it, so a missing extra stops it at start with one line.

    Raises:
        EnvExtraError: a `agentrl.extras.MissingExtraError`, or a `ModuleNotFoundError` for a module that belongs
            to an extra; any other error passes unchanged.
    """
    try:
        yield
    except (MissingExtraError, ModuleNotFoundError) as e:
        error = _extra_error(env_id, e)
        if error is None:
            raise
        raise error from None


def _extra_error(env_id: str, error: BaseException) -> EnvExtraError | None:
    """`error` as an `EnvExtraError` when it says that a package of an extra is missing, else None."""
    if isinstance(error, MissingExtraError):  # raised where the package is used: it names the feature already
        return EnvExtraError(str(error))
    if isinstance(error, ModuleNotFoundError):
        named = f"the {env_id} env" if env_id.replace("-", "_").isidentifier() else f"env {env_id!r}"
        message = missing_extra_message(error, named)
        return EnvExtraError(message) if message is not None else None
    return None


def short_name(env_id: str) -> str:
    """A folder-safe name for `env_id`: a registered id as is, the class name of a ``module:Class`` id.

    A served env's URL gives its env name (``http://host:8000/webshop`` -> ``webshop``).
    """
    if env_id.startswith(("http://", "https://", "openenv+")):
        from agentrl.envs.remote import url_name

        name = url_name(env_id.removeprefix("openenv+"))
        return name if not env_id.startswith("openenv+") or "/" in env_id.split("//", 1)[1] else "openenv"
    return env_id.rpartition(":")[2] if ":" in env_id else env_id


def _remote_spec(url: str) -> EnvSpec:
    """The spec of a served env (``http://HOST:PORT/NAME``): a `RemoteEnv` class standing in for the served one."""
    from agentrl.envs.remote import RemoteEnvError, remote_env_class

    try:
        cls = remote_env_class(url)
    except RemoteEnvError as e:
        raise EnvLoadError(f"cannot use env {url!r}: {e}") from None
    return EnvSpec(id=url, entry_point=cls, package=cls.url)


def _import_spec(id: str) -> EnvSpec:
    """The spec of a ``package.module:Class`` or ``path/to/file.py:Class`` id, importing its code now."""
    source, _, attr = id.rpartition(":")
    if not source or not attr.isidentifier():
        raise EnvLoadError(f"cannot load env {id!r}: expected 'package.module:ClassName' or "
                           f"'path/to/file.py:ClassName'")
    log.debug("env %r: importing %s %r", id, "file" if _is_file(source) else "module", source)
    module = _load_file(id, source) if _is_file(source) else _import_module(id, source)
    cls = getattr(module, attr, None)
    where = source if _is_file(source) else f"module {source!r}"
    if cls is None:
        found = [name for name, obj in vars(module).items()
                 if isinstance(obj, type) and issubclass(obj, TextEnv) and obj.__module__ == module.__name__]
        hint = f" (its TextEnv classes: {', '.join(found)})" if found else " (it defines no TextEnv subclass)"
        raise EnvLoadError(f"cannot load env {id!r}: {where} has no {attr!r}{hint}")
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        kind = f"class {cls.__name__}" if isinstance(cls, type) else f"a {type(cls).__name__}"
        raise EnvLoadError(f"cannot load env {id!r}: {attr} in {where} is {kind}, not an agentrl.TextEnv subclass; "
                           f"derive it from agentrl.TextEnv")
    code = _code_to_ship(module)
    _loaded_code.update(dict.fromkeys(code))
    return EnvSpec(id=id, entry_point=f"{module.__name__}:{attr}", package=source, py_modules=code)


def loaded_env_code() -> tuple[str, ...]:
    """Files and package folders of the ``module:Class`` / ``file.py:Class`` envs loaded so far in this process.

    `agentrl.cluster.start_ray` ships them to Ray workers; installed code is not listed (every node has it).
    """
    return tuple(path for path in _loaded_code if os.path.exists(path))  # a deleted temp file cannot be shipped


def _is_file(source: str) -> bool:
    return source.endswith(".py") or "/" in source or os.sep in source


def _load_file(id: str, source: str) -> ModuleType:
    """Import `source` (a .py file) as the top-level module named after its stem, as ``python -c 'import x'`` would.

    The stem is the module name Ray runners import it by (the file reaches them through ``py_modules``), so the
    driver uses the same name; a name already taken by another module is refused rather than silently shadowed.
    """
    path = Path(source).expanduser().resolve()
    if not path.is_file():
        raise EnvLoadError(f"cannot load env {id!r}: no file {source!r} (a relative path starts from the current "
                           f"folder, {os.getcwd()})")
    name = path.stem
    if path.suffix != ".py" or "." in name or not name:
        raise EnvLoadError(f"cannot load env {id!r}: {source!r} must be a Python file named like my_env.py")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if _same_file(getattr(loaded, "__file__", None), path):
            return loaded
        raise EnvLoadError(f"cannot load env {id!r}: {source} would be imported as module {name!r}, which is already "
                           f"{getattr(loaded, '__file__', None) or 'a built-in module'}; rename the file")
    found = importlib.util.find_spec(name)
    if found is not None and not _same_file(found.origin, path):
        raise EnvLoadError(f"cannot load env {id!r}: {source} would be imported as module {name!r}, which would "
                           f"shadow {found.origin or 'an existing package'}; rename the file")
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None  # a .py path always has a source loader
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before executing, as import does: dataclasses and pickle look the module up
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise _extra_error(id, e) or EnvLoadError(f"cannot load env {id!r}: {_located(e, path)}") from None
    return module


def _import_module(id: str, source: str) -> ModuleType:
    try:
        return importlib.import_module(source)
    except ModuleNotFoundError as e:
        if e.name and (source == e.name or source.startswith(e.name + ".")):
            raise EnvLoadError(f"cannot load env {id!r}: no module named {e.name!r} on sys.path; install it, run "
                               f"from the folder that holds it (or pass --app-dir FOLDER), or name a file: "
                               f"path/to/file.py:Class") from None
        raise _extra_error(id, e) or EnvLoadError(f"cannot load env {id!r}: {_located(e, None)}") from None
    except Exception as e:
        raise _extra_error(id, e) or EnvLoadError(f"cannot load env {id!r}: {_located(e, None)}") from None


def _same_file(origin: str | None, path: Path) -> bool:
    return origin is not None and Path(origin).resolve() == path


def _located(exc: BaseException, path: Path | None) -> str:
    """``file line N: Type: message`` for an exception raised while importing: in `path` when it is on the stack."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{_shown(exc.filename)} line {exc.lineno}: SyntaxError: {exc.msg}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    mine = [f for f in frames if path is not None and _same_file(f.filename, path)]
    frame = (mine or frames or [None])[-1]
    where = f"{_shown(frame.filename)} line {frame.lineno}: " if frame is not None else ""
    message = str(exc).strip().splitlines()
    return f"{where}{type(exc).__name__}: {message[0] if message else '(no message)'}"


def _shown(filename: str) -> str:
    """`filename` relative to the current folder when it is inside it (what the user typed), else as is."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    except ValueError:
        return filename


def _code_to_ship(module: ModuleType) -> tuple[str, ...]:
    """The file or package folder runner processes need to import `module`; () for installed code.

    Installed code (site-packages, the standard library, agentrl itself) is expected on every node already, as
    agentrl is; shipping it would upload it for every run.
    """
    top_name = module.__name__.partition(".")[0]
    if top_name == "agentrl":
        return ()
    top = sys.modules.get(top_name, module)
    paths = list(getattr(top, "__path__", []) or [])
    if len(paths) > 1:  # a namespace package spread over folders: Ray cannot ship it; it must be installed
        return ()
    location = paths[0] if paths else getattr(top, "__file__", None)
    if not location:
        return ()
    resolved = Path(location).resolve()
    installed = [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["stdlib"]]
    if any(resolved.is_relative_to(Path(root).resolve()) for root in installed):
        return ()
    return (str(resolved),)
