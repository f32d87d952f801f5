"""Salience core: data, ranking models, training, tracking and export."""

__version__ = "0.1.0"
