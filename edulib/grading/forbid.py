"""Inside a check, the functions that would answer the exercise are out of reach: best effort.

Before a submission is imported, every name under which an answering function is reachable
(`torch.distributed.all_reduce`, `edulib.comm.build_collective`, its aliases in other modules)
is replaced by a stub that records the attempt and raises `Forbidden`. The attempt is reported
with the check's answers, and the grader scores it 0 with "this exercise must implement X
itself", even when the submission catches the exception. Reloading a module to get the
original back is refused the same way, and a stand-in has no `__wrapped__` to reach it through.

Then `confine.hide` takes the files of those modules out of reach (Landlock, where the kernel offers it):
from then on the submission's process and its ranks cannot read their sources or bytecode, so a
second copy cannot be loaded (`importlib`, `spec_from_file_location`, `exec` of the source text,
`reload`, `inspect`); the copies already imported hold the stand-ins. What stays possible is to
find a surviving original in memory (the garbage collector's objects); no point depends on the
stand-ins alone: every answer is judged against the grader's own reference and what the relay saw.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

attempts: list[str] = []  # what this process reached for, in order


class Forbidden(Exception):
    """A submission called a function that answers its exercise."""


def _resolve(dotted: str) -> tuple[ModuleType, object]:
    """The module that defines `dotted` (imported here) and the object it names."""
    module_name, _, attribute = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    return module, getattr(module, attribute)


def _stub(dotted: str, what: str) -> Callable:
    """What stands in for `dotted`: calling it records the attempt and raises Forbidden; a class's
    stand-in also records being subclassed (and raises once an instance is made)."""
    def refused(*args: object, **kwargs: object) -> None:
        attempts.append(f"this exercise must implement {what} itself (it called {dotted})")
        raise Forbidden(attempts[-1])
    original = _resolve(dotted)[1]
    if not isinstance(original, type):
        functools.update_wrapper(refused, original, updated=())
        del refused.__wrapped__  # update_wrapper would hand the original back through it
        return refused

    class Refused:
        def __new__(cls, *args: object, **kwargs: object) -> None:
            refused()

        def __init_subclass__(cls, **kwargs: object) -> None:
            attempts.append(f"this exercise must implement {what} itself (it subclassed {dotted})")
    Refused.__name__ = Refused.__qualname__ = original.__name__
    return Refused


class _NoReload:
    """A meta-path finder that refuses to load a guarded module a second time."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name in self.names and name in sys.modules:
            attempts.append(f"this exercise must implement it itself (it reloaded {name})")
            raise Forbidden(attempts[-1])


def forbid(names: Iterable[tuple[str, str]]) -> None:
    """Put each (dotted name, what the exercise implements) out of reach in this process."""
    stubs, modules, seen = {}, set(), set()
    for dotted, what in names:
        module, original = _resolve(dotted)
        stubs[id(original)] = (original, _stub(dotted, what))  # the original kept, so ids stay unique
        modules.add(module.__name__)
    for module in list(sys.modules.values()):
        space = getattr(module, "__dict__", None)
        if not isinstance(space, dict) or not str(module.__name__).startswith(("edulib", "torch")):
            continue
        for key, value in list(space.items()):
            if id(value) in stubs:
                space[key] = stubs[id(value)][1]
            elif str(module.__name__).startswith("edulib"):  # edulib's registries (torch holds none)
                _replace(value, stubs, seen)
    sys.meta_path.insert(0, _NoReload(modules))


def _replace(holder: object, stubs: dict[int, tuple[object, Callable]], seen: set[int]) -> None:
    """Put the stand-in in place of each original that `holder` holds: a module's names, and inside
    the registries it holds (dicts, lists, and the records they keep: a dataclass's fields, frozen or
    not), so `ALGORITHMS["halving_doubling"]` or a schedule record's builder is no way around."""
    kind = type(holder)
    if kind not in (dict, list) and not hasattr(kind, "__dataclass_fields__") or id(holder) in seen:
        return
    seen.add(id(holder))
    if kind is dict:
        for key, value in list(holder.items()):
            if id(value) in stubs:
                holder[key] = stubs[id(value)][1]
            else:
                _replace(value, stubs, seen)
    elif kind is list:
        for index, value in enumerate(holder):
            if id(value) in stubs:
                holder[index] = stubs[id(value)][1]
            else:
                _replace(value, stubs, seen)
    else:
        for item in dataclasses.fields(holder):
            value = getattr(holder, item.name, None)
            if id(value) in stubs:
                object.__setattr__(holder, item.name, stubs[id(value)][1])
            else:
                _replace(value, stubs, seen)


def sources(names: Iterable[tuple[str, str]]) -> set[Path]:
    """The files of the edulib modules that define these names: sources and their bytecode."""
    import edulib

    package = Path(edulib.__file__).resolve().parent
    found: set[Path] = set()
    for dotted, _ in names:
        module = _resolve(dotted)[0]
        source = Path(getattr(module, "__file__", "") or "/").resolve()
        if package not in source.parents:
            continue
        found.add(source)
        cache = source.parent / "__pycache__"
        if cache.is_dir():
            found |= {entry.resolve() for entry in cache.iterdir()
                      if entry.name.startswith(source.stem + ".")}
    return found
