"""`media_path`: a test module that uses it runs once on each media path (rtp.speedups: pure, and compiled
where the extension is built; skipped where it is not), its functions put where the media cores and the
module itself look them up (tests/support/media_paths.py). Module-scoped, so hypothesis tests may use it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rtp import speedups
from tests.support.media_paths import IMPLS, use


@pytest.fixture(scope="module", params=["pure", "compiled"])
def media_path(request: pytest.FixtureRequest) -> Iterator[speedups.Impl]:
    impl = IMPLS.get(request.param)
    if impl is None:
        pytest.skip("the compiled media path is not built here (rtp/_speedups.c)")
    with use(impl, request.module) as chosen:
        yield chosen
