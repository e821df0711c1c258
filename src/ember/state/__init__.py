"""Keyed state declarations (what a function asks for); the runner supplies the state."""

from ember.state.descriptors import ValueStateDescriptor

__all__ = ["ValueStateDescriptor"]
