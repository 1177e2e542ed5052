"""`python -m bridge` is `parlora-bridge`.

`python -m bridge fake-provider ...` runs that command alone (bridge/cli/fake.py), without importing `serve`'s
modules.

The cyclic collector is off while the command's modules import: they build some 300 dataclasses and 500
modules, and every full collection in the middle walked all that was built so far again. What they built is
then frozen (bridge/server/heap.py says why; `serve` freezes once more after its calls' modules), so neither a
collection later nor the one at exit walks it either: a `fake-provider` took 0.4-0.7 s to exit after SIGTERM,
0.1 s frozen, and a start of `serve` or `fake-provider` takes 0.2-0.3 s less CPU (measured on 7 December 2026).
"""

import gc
import sys

gc.disable()
if sys.argv[1:2] == ["fake-provider"]:
    from bridge.cli.fake import fake_provider

    gc.freeze()
    gc.enable()
    fake_provider(sys.argv[2:], prog_name="parlora-bridge fake-provider")
else:
    from bridge.cli.commands import main

    gc.freeze()
    gc.enable()
    main()
