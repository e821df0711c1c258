"""Former home of the user function interfaces, kept so existing imports work:
they live in :mod:`ember.functions` now."""

from ember.functions import *  # noqa: F401,F403
from ember.functions import DEAD_LETTER_SCHEMA, __all__  # noqa: F401
