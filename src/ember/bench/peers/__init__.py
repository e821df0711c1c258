"""``ember bench peers``: Ember beside Bytewax and PyFlink on the same events (runner.py)."""
