"""docs/development.md's list of make targets is `make help`'s own output (the targets'
`##` comments in the Makefile and the default ports), so a target added or reworded shows
up in the docs too: regenerate with MEMFABRIC_UPDATE_DOCS=1."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from memfabric import settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "development.md"
BLOCK = re.compile(r"(## Make targets\n\n```\n)(.*?)(```\n)", re.S)
# the variables `make help` reads for the ports it prints: unset, it prints the defaults
PORT_VARIABLES = (
    "DATABASE_URL",
    "PGPORT",
    "NEO4J_URI",
    "GRAPH_BOLT_PORT",
    "GRAPH_HTTP_PORT",
    "REDIS_URL",
    "REDIS_PORT",
)


def make_help() -> str:
    env = {k: v for k, v in os.environ.items() if k not in PORT_VARIABLES}
    env.pop("MAKEFLAGS", None)
    return subprocess.run(
        ["make", "--no-print-directory", "-s", "help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_make_help_lists_every_local_servers_port() -> None:
    """Each port of a server the project starts locally (Settings' defaults) is listed with
    its variable and its default."""
    ports = {
        name: value
        for name, value in vars(settings).items()
        if name.startswith("DEFAULT_") and name.endswith("PORT")
    }
    assert "DEFAULT_REDIS_PORT" in ports
    listed = make_help().split("Ports (", 1)[1]
    for name, value in ports.items():
        variable = name.removeprefix("DEFAULT_")
        assert f"127.0.0.1:{value}   {variable} ({value})" in listed, (variable, listed)


def test_the_make_targets_in_the_docs_are_make_help() -> None:
    helped = make_help()
    text = DOC.read_text()
    found = BLOCK.search(text)
    assert found, "docs/development.md has no '## Make targets' block"
    if os.environ.get("MEMFABRIC_UPDATE_DOCS"):
        DOC.write_text(text[: found.start(2)] + helped + text[found.end(2) :])
        return
    assert found.group(2) == helped, (
        "docs/development.md's make targets are stale: regenerate with MEMFABRIC_UPDATE_DOCS=1"
    )
