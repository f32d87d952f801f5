"""Salience core: data, ranking models, training, tracking and export."""

__version__ = "0.1.0"

from recsys.moved import install as _install_moved_names

_install_moved_names()
