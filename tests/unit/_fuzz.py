"""Hypothesis settings shared by the fuzz tests (tests/unit/test_fuzz_*.py).

By default a run is derandomized (the same examples every time: `make test` stays
deterministic) and modest in size. KVDECK_FUZZ=N explores N random examples per test instead,
e.g. `KVDECK_FUZZ=2000 .venv/bin/python -m pytest -q tests/unit/test_fuzz_*.py`.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_DEEP = int(os.environ.get("KVDECK_FUZZ", "0"))


def fuzz_settings(examples: int) -> settings:
    """``examples`` derandomized examples, or KVDECK_FUZZ random ones when that is set."""
    return settings(max_examples=_DEEP or examples, derandomize=not _DEEP, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
