"""The optional pjsua2 engine (the `pjsua2` extra; GPL, never in the default install)."""
