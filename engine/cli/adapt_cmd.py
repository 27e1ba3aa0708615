"""``polyindex adapt``: learn an encoder from a collection and re-encode it with it (or
``--revert`` to the previous one); ``index --adapt`` runs the same after a new collection's
ingest. Progress (phase, rate, ETA) on stderr; the report as a table or JSON."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from polyindex.cli.options import CollOpt, DataOpt, DeviceOpt, JsonOpt, open_engine
from polyindex.errors import InvalidArgument

RecipeOpt = typer.Option(None, "--recipe", metavar="KEY=VALUE", help="A learning setting (adapt.recipe.Recipe's fields, e.g. steps=2), repeatable; default: the fixed recipe.")


class Progress:
    """``progress(phase, done, total, ...)`` as a line every few seconds on stderr: the
    phase, done of total, the rate and the time left."""

    def __init__(self, every: float = 2.0, stream=sys.stderr):
        self.every, self.stream = every, stream
        self.phase, self.last = None, 0.0
        self.t0 = self.seen = time.monotonic()

    def __call__(self, phase, done=None, total=None, *rest) -> None:
        now = time.monotonic()
        if phase != self.phase:  # a phase began when the one before last reported
            self.phase, self.t0, self.last = phase, self.seen, 0.0
        self.seen = now
        if not isinstance(done, (int, float)) or not isinstance(total, (int, float)):
            return
        if now - self.last < self.every and done < total:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        eta = (total - done) / rate if rate > 0 else float("inf")
        print(f"adapt: {phase} {done:,}/{total:,} ({rate:,.1f}/s, "
              f"{'ETA %.0f s' % eta if eta != float('inf') else 'ETA ?'})",
              file=self.stream, flush=True)


def parse_recipe(items: list[str] | None) -> dict | None:
    """``KEY=VALUE`` settings (JSON values: numbers parsed), or None."""
    if not items:
        return None
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"--recipe {item!r}: give KEY=VALUE")
        try:
            values[key] = json.loads(value)
        except ValueError:
            values[key] = value
    return values  # made a Recipe (and checked) by adapt.run.recipe_of


def run(coll, *, revert: bool, device: str, recipe, as_json: bool, show_progress: bool,
        say=print, ray: dict | None = None) -> dict:
    report = coll.adapt(revert=revert, device=device, recipe=recipe, ray=ray,
                        progress=Progress() if show_progress else None)
    if as_json:
        print(json.dumps(report, default=str))
    else:
        say(describe(coll.name, report, revert))
    return report


def describe(name: str, report: dict, revert: bool = False) -> str:
    """The report as a line for people: what was committed, or why nothing was."""
    secs = report["seconds"]
    if report.get("committed") is False:
        return (f"not adapted {name!r}: the learned encoder was not committed, the collection "
                f"keeps encoder {report['encoder']} and its answers ({secs['learn']:.1f} s "
                f"spent learning): {report['refused']}")
    what = "reverted" if revert else "adapted"
    return (f"{what} {name!r}: encoder {report['encoder']} (was {report['previous']}); "
            f"{report['documents']:,} documents, {report['reencoded_rows']:,} rows re-encoded "
            f"(+{report['delta_rows']:,} written meanwhile) in {len(report['seconds'])} "
            f"phases: learn {secs['learn']:.1f} s, re-encode and commit "
            f"{secs['reencode_and_commit']:.1f} s")


def adapt(data: Path = DataOpt, collection: str = CollOpt,
          revert: bool = typer.Option(False, "--revert", help="Go back to the previous encoder (the base model after one adapt): its vectors, its answers."),
          ray: bool = typer.Option(False, "--ray", help="Re-encode on Ray encoder actors (the extra polyindex[ray]), one segment a task: a local, loopback-only Ray unless --ray-address."),
          ray_address: Optional[str] = typer.Option(None, "--ray-address", metavar="ADDR", help="Join the Ray cluster at ADDR (with --ray); DATA must be on storage every node sees."),
          encoders: int = typer.Option(1, "--encoders", help="Encoder actors (with --ray), each loading the encoder once."),
          recipe: Optional[List[str]] = RecipeOpt,
          progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress (phase, rate, ETA) on stderr."),
          as_json: bool = JsonOpt, device: str = DeviceOpt):
    """Learn an encoder from a collection's own texts and re-encode the collection with it.

    Synthetic queries from the documents, the collection's current profile as a noisy
    teacher, a fine-tuned copy of its encoder as the student; the new encoder and every
    re-encoded vector are committed together (an interrupted adapt changes nothing; a rerun
    resumes). Needs the data directory's writer lock: stop a server first, or use its admin
    RPC."""
    if (ray_address is not None or encoders != 1) and not ray:
        raise InvalidArgument("--ray-address and --encoders go with --ray")
    if ray:
        from polyindex.distributed.cluster import require_ray
        require_ray()  # before anything: without Ray, the line that says how to get it
    from polyindex.cuda.device import check_device
    check_device(device)
    parsed = parse_recipe(recipe)
    eng = open_engine(data, create=False, device=device)
    try:
        run(eng.collection(collection), revert=revert, device=device, recipe=parsed,
            as_json=as_json, show_progress=progress,
            ray={"encoders": encoders, "address": ray_address} if ray else None)
    finally:
        eng.close()
