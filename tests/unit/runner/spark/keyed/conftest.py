"""``state_layout``: run a test module's bucket-driven tests on both keyed state layouts
(``pytestmark = pytest.mark.usefixtures("state_layout")``; bucket_driver.py)."""

from __future__ import annotations

import bucket_driver
import pytest


@pytest.fixture(params=["blob", "delta"])
def state_layout(request, monkeypatch, tmp_path):
    monkeypatch.setattr(bucket_driver, "LAYOUT", (request.param, str(tmp_path / "local-state")))
    return request.param
