"""The Returns and Raises sections that every pass factory's docstring shares.

Every factory returns a Relay function pass registered under its explicit name, and every pass raises
``UntypedModuleError`` on a module without types. ``@factory_sections(PASS_NAME)`` writes those two
numpydoc sections into the factory's docstring (before its ``Notes``, else at the end), so a pass
module's docstring holds only what is its own; ``help()``, ``inspect.getdoc`` and Sphinx read the
completed text. A docstring that already has either section is a mistake and raises at import.
"""
from __future__ import annotations

import inspect

_NOTES = "\nNotes\n-----\n"


def _sections(pass_name: str, opt_level: int, raises) -> str:
    lines = ["Returns", "-------", "tvm.transform.Pass",
             f'    A Relay function pass named ``"{pass_name}"`` (opt_level {opt_level}).', "",
             "Raises", "------"]
    for exc, when in (*raises, ("tvm_ext.passes._util.UntypedModuleError",
                                "When run on a module that was not type-inferred.")):
        lines += [exc, f"    {when}"]
    return "\n".join(lines)


def factory_sections(pass_name: str, opt_level: int = 1, raises: tuple = ()):
    """Decorator: the factory's docstring with the shared Returns and Raises sections written in.

    ``raises``: further ``(exception, when)`` entries of the Raises section, listed before the shared
    one (errors of the factory's own arguments, raised at construction).
    """
    def decorate(factory):
        doc = inspect.cleandoc(factory.__doc__ or "")
        if not doc:
            raise ValueError(f"factory_sections: {factory.__name__} has no docstring")
        for title in ("Returns", "Raises"):
            if f"\n{title}\n{'-' * len(title)}\n" in f"\n{doc}\n":
                raise ValueError(f"factory_sections: {factory.__name__}'s docstring already has {title}")
        head, notes, tail = doc.partition(_NOTES)
        factory.__doc__ = f"{head.rstrip()}\n\n{_sections(pass_name, opt_level, raises)}\n{notes}{tail}".rstrip()
        return factory

    return decorate
