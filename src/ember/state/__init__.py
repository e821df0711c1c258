"""Keyed state: the declarations a function asks for (descriptors) and the
interfaces of the state objects the runner supplies for them."""

from ember.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from ember.state.interfaces import AggregatingState, ListState, MapState, ReducingState, State, ValueState

__all__ = [
    "StateDescriptor",
    "StateTtlConfig",
    "ValueStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "AggregatingStateDescriptor",
    "State",
    "ValueState",
    "ListState",
    "MapState",
    "ReducingState",
    "AggregatingState",
]
