"""The unit suite's hypothesis profile for its second run: a pytest plugin (`-p tests.support.smoke_profile`).

`--hypothesis-profile smoke` (tests/run.sh: the unit suite once more, on Python 3.13) draws at most
SMOKE_EXAMPLES examples in every property test and state machine, their own `@settings(max_examples=...)`
included (hypothesis lets a test's own settings win over a profile's). That run shows that the project installs
and its code runs on a newer Python; the run on the project's Python draws every example each test asks for.
Without the profile nothing here changes a test.
"""

from __future__ import annotations

from typing import Any

import hypothesis.stateful
import pytest
from hypothesis import settings

SMOKE = "smoke"
SMOKE_EXAMPLES = 20  # of the 100-300 most tests draw (the session machine: 200 histories)

settings.register_profile(SMOKE, max_examples=SMOKE_EXAMPLES)


def _smoke() -> bool:
    return settings.get_current_profile_name() == SMOKE


def _capped(given: settings) -> settings:
    return settings(given, max_examples=min(given.max_examples, SMOKE_EXAMPLES))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not _smoke():
        return
    for item in items:
        test = getattr(item, "obj", None)
        test = getattr(test, "__func__", test)  # a method's function
        # what the test @given made reads its settings from, each time it runs
        given = getattr(test, "_hypothesis_internal_use_settings", None)
        if isinstance(given, settings):
            test._hypothesis_internal_use_settings = _capped(given)


_run_state_machine_as_test = hypothesis.stateful.run_state_machine_as_test


def _run_capped(factory: Any, *, settings: Any = None, **kwargs: Any) -> None:
    if _smoke():
        settings = _capped(settings if settings is not None else hypothesis.settings.default)
    _run_state_machine_as_test(factory, settings=settings, **kwargs)


# The test modules import it by name after this plugin: the state machines take the cap as well.
hypothesis.stateful.run_state_machine_as_test = _run_capped
