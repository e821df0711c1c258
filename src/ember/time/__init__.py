"""Time in Ember: integer milliseconds inside, ``timedelta`` accepted at the edge."""

from ember.time.clock import Clock, ManualClock, SystemClock
from ember.time.durations import to_ms
from ember.time.watermarks import TimeCharacteristic, WatermarkStrategy

__all__ = ["to_ms", "TimeCharacteristic", "WatermarkStrategy", "Clock", "SystemClock", "ManualClock"]
