"""The optional compiled media path (rtp/_speedups.c; rtp/speedups.py chooses it at import).

Everything else about the package is in pyproject.toml. The extension is `optional`: where no compiler (or no
Python headers) is found, setuptools reports the failure and installs the package without it, and the pure
path runs. PARLORA_BUILD_SPEEDUPS=1 makes a failed build an error instead (to check that a machine builds it).
"""

import os

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rtp._speedups",
            sources=["rtp/_speedups.c"],
            optional=os.environ.get("PARLORA_BUILD_SPEEDUPS", "") != "1",
        )
    ]
)
