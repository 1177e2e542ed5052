"""Both media paths (rtp.speedups: the compiled twins and the pure functions) for the rtp unit tests.

`use(impl, *modules)` puts one implementation's functions where the media cores look them up (rtp.stream's
parse, pack_into and G.711 decoders, rtp.jitter's decoders and `JitterBuffer`'s default one) and into each
module given that binds one of the same names (a test module's own imports), for the time of the block. The
`media_path` fixture (below; a test module imports it) runs the module once per path this way: pure, and compiled
where the extension is built (skipped where it is not). Module-scoped, so hypothesis tests may use it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest

import rtp.jitter
import rtp.stream
from rtp import speedups
from rtp.g711 import alaw_decode, ulaw_decode
from rtp.jitter import JitterBuffer, table_decoder

IMPLS = {"pure": speedups.pure, **({"compiled": speedups.compiled} if speedups.compiled is not None else {})}


def decoders(impl: speedups.Impl) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """The µ-law and A-law frame decoders of `impl` (rtp.jitter `fast_ulaw_decode`, `fast_alaw_decode`)."""
    return table_decoder(ulaw_decode, impl.table_decode), table_decoder(alaw_decode, impl.table_decode)


@contextmanager
def use(impl: speedups.Impl, *modules: ModuleType) -> Iterator[speedups.Impl]:
    ulaw, alaw = decoders(impl)
    names = {
        "parse": impl.parse,
        "pack_into": impl.pack_into,
        "fast_ulaw_decode": ulaw,
        "fast_alaw_decode": alaw,
    }
    with pytest.MonkeyPatch.context() as patch:
        for module in (rtp.stream, rtp.jitter, *modules):
            for name, value in names.items():
                if hasattr(module, name):
                    patch.setattr(module, name, value)
        patch.setattr(JitterBuffer.__init__, "__defaults__", (ulaw,))
        yield impl


@pytest.fixture(scope="module", params=["pure", "compiled"])
def media_path(request: pytest.FixtureRequest) -> Iterator[speedups.Impl]:
    impl = IMPLS.get(request.param)
    if impl is None:
        pytest.skip("the compiled media path is not built here (rtp/_speedups.c)")
    with use(impl, request.module) as chosen:
        yield chosen
