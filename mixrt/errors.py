"""The typed errors mixrt raises, under their public name.

Every error derives from :class:`MixrtError` so a service can catch one type. The classes
are defined in the ground floor (``base/errors.py``, ``mixrt.base.errors``), which every
layer imports; this module is the name users catch them by, and the classes report it as
their module (``mixrt.errors.InputError``).
"""

from mixrt.base.errors import *  # noqa: F401,F403
from mixrt.base.errors import __all__  # noqa: F401
