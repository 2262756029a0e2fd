# SPDX-License-Identifier: MIT
"""The interface of fla 0.6.0's ``fla.backends`` as flash_kda's backend uses it: ``BaseBackend``
(type, package, switch variable, default, priority; ``<function>_verifier`` and ``<function>``
methods), ``register(entry_point)`` of a backend class (one backend per type: a later one of
the same type replaces it), and ``dispatch``: the enabled backends by priority (lower first),
the first whose verifier accepts the call runs it, else the function itself. ``REJECTIONS``
records each refusal's (backend type, reason)."""

import importlib.util
import os
from functools import wraps
from inspect import unwrap

REJECTIONS = []


class BaseBackend:
    backend_type = "base"
    package_name = None
    env_var = None
    default_enable = True
    priority = 5
    implementation = None
    verifier = None

    def __init__(self, *, env_var=None):
        if env_var is not None:
            self.env_var = env_var

    def get_implementation(self, function_name):
        return self.implementation if self.implementation is not None else getattr(self, function_name, None)

    @classmethod
    def is_available(cls):
        return cls.package_name is None or importlib.util.find_spec(cls.package_name) is not None

    def is_enabled(self):
        if self.env_var is None:
            return True
        if os.environ.get(f"FLA_{self.backend_type.upper()}", "0") != "0":  # the whole type switched on
            return True
        return os.environ.get(self.env_var, "1" if self.default_enable else "0") != "0"

    def verify(self, function_name, *args, **kwargs):
        verifier = self.verifier or getattr(self, f"{function_name}_verifier", None)
        if verifier is None:
            return True, None
        try:
            return verifier(*args, **kwargs)
        except Exception as err:
            return False, str(err)


class BackendRegistry:
    def __init__(self, operation_name):
        self.operation_name = operation_name
        self._backends = {}

    def register(self, backend):
        self._backends[backend.backend_type] = backend

    def _get_sorted_backends(self):
        return sorted(self._backends.values(), key=lambda backend: backend.priority)

    def dispatch(self, default_function):
        name = default_function.__name__

        @wraps(default_function)
        def wrapper(*args, **kwargs):
            for backend in self._get_sorted_backends():
                if not (backend.is_available() and backend.is_enabled()):
                    continue
                accepted, reason = backend.verify(name, *args, **kwargs)
                if not accepted:
                    REJECTIONS.append((backend.backend_type, reason))
                    continue
                implementation = backend.get_implementation(name)
                if implementation is not None:
                    return implementation(*args, **kwargs)
            return default_function(*args, **kwargs)

        return wrapper


_function_registries = {}


def register(entry_point, *, backend=None, verifier=None, env_var=None):
    def decorator(implementation):
        if isinstance(implementation, type):
            registered = implementation()
        else:
            registered = backend() if backend is not None else BaseBackend()
            registered.implementation = implementation
        registered.verifier = verifier
        if env_var is not None:
            registered.env_var = env_var
        _function_registries[unwrap(entry_point)].register(registered)
        return implementation

    return decorator


def dispatch(entry_point):
    registry = BackendRegistry(entry_point.__module__)
    _function_registries[unwrap(entry_point)] = registry
    return registry.dispatch(entry_point)


def registry_of(entry_point):
    """The registry of a dispatched function (for the tests)."""
    return _function_registries[unwrap(entry_point)]
