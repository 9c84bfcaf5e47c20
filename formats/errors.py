"""Errors a user can cause by pointing tessera at model files. Each message says what was wrong
and what to do."""

from __future__ import annotations


class ModelFormatError(ValueError):
    """The model files are missing, malformed or of a kind tessera cannot serve."""


class UnsupportedModelError(ModelFormatError):
    """A valid model of an architecture or quantisation type tessera does not implement."""


class WeightShapeError(ModelFormatError):
    """A tensor in the files does not have the shape the config implies."""
