"""tfrun set up on a box (`tfrun hosts install`): the steps in order (steps.py), each on the box (onbox.py), and
the wheel shipped with it (wheel.py).

Stands on: link, config, errors.
"""
