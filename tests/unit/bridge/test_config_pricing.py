"""The rate table and the budget (bridge/cli/config.py, bridge/cli/ops.py, bridge/engine/usage.py):
`[pricing.NAME]` typed and checked like every table, a route's `budget` reaching the call's setup, and both
reaching what `serve` runs; no budget is no limit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.cli.config import ConfigError, load, parse
from bridge.cli.ops import RoutedApplication, server_config
from bridge.engine.usage import Pricing
from bridge.server.api import Application
from sip.leg import CallIdentity


def identity(called: str) -> CallIdentity:
    return CallIdentity("c1", "sip-c1", "sip:a@x", f"sip:{called}@y", called, "127.0.0.1:5000", (), "inbound")


def test_pricing_tables_and_a_route_s_budget_are_read() -> None:
    config = parse(
        {
            "pricing": {"xai": {"audio_per_minute": 0.05}, "echo": {"input_tokens_per_million": 2}},
            "routes": [{"name": "capped", "number": "100", "budget": 1.5}, {"name": "open"}],
        }
    )
    assert dict(config.pricing) == {
        "xai": Pricing(audio_per_minute=0.05),
        "echo": Pricing(input_tokens_per_million=2.0),
    }
    assert [r.budget for r in config.routes] == [1.5, None]  # None: no limit


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            {"pricing": {"gpt": {"audio_per_minute": 1}}},
            "pricing.gpt: expected a pricing section named one of",
        ),
        (
            {"pricing": {"xai": {"audio_per_minute": -1}}},
            "pricing.xai.audio_per_minute: expected a number >= 0",
        ),
        (
            {"pricing": {"xai": {"per_minute": 1}}},
            'pricing.xai.per_minute: unknown key (did you mean "audio_',
        ),
        (
            {"pricing": {"xai": {"audio_per_minute": "cheap"}}},
            "pricing.xai.audio_per_minute: expected a number",
        ),
        ({"routes": [{"name": "r", "budget": 0}]}, "routes[0].budget: expected a number > 0; got 0"),
        ({"routes": [{"name": "r", "budget": "ten"}]}, "routes[0].budget: expected a number > 0"),
    ],
)
def test_a_bad_rate_or_budget_refuses_the_file(data: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(data)
    assert any(problem in line for line in refused.value.problems), refused.value.problems


def test_the_route_s_budget_reaches_the_call_and_the_rates_the_server(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(
        "[pricing.echo]\naudio_per_minute = 0.1\n"
        '[[routes]]\nname = "capped"\nnumber = "100"\nbudget = 0.75\n[[routes]]\nname = "open"\n'
    )
    config = load(path)
    app = RoutedApplication(Application(), config)
    assert [asyncio.run(app.setup(identity(n))).budget for n in ("100", "101")] == [0.75, None]
    assert dict(server_config(config, {}).pricing) == {"echo": Pricing(audio_per_minute=0.1)}
