"""Every mutant of the catalogue as a sampler spec, for the front ends a user runs:

    PYTHONPATH=<checkout> pytest -p rs_verify --rs-sampler=mutants.samplers:<mutant name> --rs-profile ci

`mutants.samplers:NAME` is a factory (module `__getattr__`) that builds the mutant in whichever
process loads it, the sampler's own child under isolation included; this is the way to show a
planted bug failing through the plugin exactly as a user's sampler would.
"""

from __future__ import annotations

from .catalogue import EQUIVALENT, MUTANTS

_BY_NAME = {m.name: m for m in MUTANTS + EQUIVALENT}


def __getattr__(name: str):
    try:
        mutant = _BY_NAME[name]
    except KeyError:
        raise AttributeError(f"no mutant named {name!r} in mutants.catalogue") from None

    def build():
        return mutant.sampler()

    build.__name__ = build.__qualname__ = name
    return build


def __dir__():
    return sorted(_BY_NAME)
