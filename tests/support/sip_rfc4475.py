"""Harness moved unchanged from tests/unit/sip/test_sip_rfc4475.py: CORPUS, _BESIDE."""

from __future__ import annotations

import os
from pathlib import Path

# shared/ beside the repository (CI's copy beside its clone), else the workplace's copy
_BESIDE = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "rfc4475"


CORPUS = Path(
    os.environ.get("PARLORA_RFC4475_DIR", _BESIDE if _BESIDE.is_dir() else "/work/shared/corpus/rfc4475")
)
