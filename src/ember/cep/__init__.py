"""Complex event processing (Flink's CEP library, in Python): patterns over each key's
events, matched on Ember's keyed state (docs/cep.md).

    from ember.cep import CEP, Pattern, PatternProcessFunction, SkipStrategy
"""

from ember.cep.operator import PatternProcessFunction
from ember.cep.pattern import Contiguity, Pattern, SkipStrategy
from ember.cep.stream import CEP, PatternStream

__all__ = ["CEP", "Pattern", "PatternStream", "PatternProcessFunction", "SkipStrategy", "Contiguity"]
