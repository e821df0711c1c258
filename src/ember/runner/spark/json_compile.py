"""``python -m ember.runner.spark.json_compile``: compile the JSON scanner, decoder and
writer once into numba's cache (``make venv`` runs it), so no job pays for it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ember.connectors.generators import YahooSource
from ember.runner.spark.generator_batches import yahoo_json
from ember.runner.spark.json_decode import decode_json


def main() -> None:
    decode_json(pa.array(['{"s": "x", "i": 1, "d": 0.5, "b": true}']),
                (("s", "string", True), ("i", "bigint", True), ("d", "double", True), ("b", "boolean", True)))
    yahoo_json(YahooSource(as_json=True), np.arange(2, dtype=np.int64), 0)
    print("JSON scanner and writer compiled")


if __name__ == "__main__":
    main()
