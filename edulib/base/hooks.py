"""Hooks on tensors that do not keep their owner alive.

A hook registered on a parameter lives in the parameter's autograd metadata, which Python's
garbage collector cannot see into. A hook that holds the wrapper that holds the parameter (a bound
method, a lambda over `self`) makes a cycle the collector never frees: every wrapper built in a
long-lived process (a pool of ranks that serves test after test) stays, with its parameters,
gradients and optimizer state. `weakly` breaks the cycle.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


def weakly(method: Callable[..., Any]) -> Callable[..., Any]:
    """The bound method as a hook that holds its object weakly (a no-op once the object is gone)."""
    found = weakref.WeakMethod(method)

    def hook(*args: Any) -> Any:
        bound = found()
        return None if bound is None else bound(*args)
    return hook
