"""``kk3evidence fingerprint [--json] [-- CMD...]``: what capture would record of this host."""

from __future__ import annotations

import click

from kk3evidence.bundle.redact import Redactor
from kk3evidence.capture.fingerprint import collect

from ._common import echo_json, handle_errors


@click.command(name="fingerprint")
@click.option("--json", "as_json", is_flag=True, help="The whole fingerprint.json document.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
@handle_errors
def command(as_json: bool, cmd: tuple[str, ...]) -> None:
    """Print this machine's fingerprint (host, GPUs through NVML, container, the Python side of
    CMD when given), redacted as in a bundle. Nothing is written."""
    fp = collect(list(cmd), redact_env=Redactor().env)
    if as_json:
        echo_json(fp.to_json())
        return
    g, c, p = fp.gpus, fp.container, fp.python
    click.echo(f"host: {fp.host.get('hostname')} {fp.host.get('kernel')}")
    click.echo(f"gpus: {g['source']} driver={g['driver_version']} cuda={g['cuda_driver_version']}")
    for d in g["devices"]:
        click.echo(f"  [{d['index']}] {d['name']} {d['uuid']} {d['pci_bus_id']}")
    click.echo(f"container: {c.get('runtime')} ({c.get('runtime_source')})")
    click.echo(f"python: {p['interpreter']} torch={p['torch_version']} vllm={p['vllm_version']}")
